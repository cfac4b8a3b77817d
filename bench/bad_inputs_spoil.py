"""How the battery (bench/bad_inputs.py) spoils a fixture: each function makes a setup that copies a fixture into
the case's folder, spoils the copy, and returns the placeholders its command uses ({bad}, ...)."""

from __future__ import annotations

import glob
import json
import math
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Setup = Callable[[dict, Path], dict]
DROP = object()  # a config value that removes the key


def copy(paths: dict, work: Path, name: str, as_name: str | None = None) -> Path:
    """A copy of fixture ``name`` (its placeholder name, e.g. "hf_llama") under the case's folder."""
    source = Path(paths[name])
    target = work / "in" / (as_name or source.name)
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("checkpoints"))
    else:
        shutil.copy2(source, target)
    return target


def edit_json(path: Path, changes: dict[str, Any]) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is DROP:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def config(name: str, **changes: Any) -> Setup:
    """Fixture ``name`` with config.json's ``changes`` (DROP removes a key)."""

    def setup(paths: dict, work: Path) -> dict:
        folder = copy(paths, work, name)
        edit_json(folder / "config.json", changes)
        return {"bad": str(folder)}

    return setup


def json_file(name: str, file: str, text: str | None = None, **changes: Any) -> Setup:
    """Fixture ``name`` with ``file`` replaced by ``text``, or its JSON edited by ``changes``."""

    def setup(paths: dict, work: Path) -> dict:
        folder = copy(paths, work, name)
        if text is not None:
            (folder / file).write_text(text)
        else:
            edit_json(folder / file, changes)
        return {"bad": str(folder)}

    return setup


def tensor(name: str, value: float = math.nan, *, file: str = "model.safetensors", which: str = "") -> Setup:
    """Fixture ``name`` whose first floating tensor (or the first whose name holds ``which``) holds ``value``
    at one place."""

    def setup(paths: dict, work: Path) -> dict:
        import torch
        from safetensors import safe_open
        from safetensors.torch import save_file

        folder = copy(paths, work, name)
        path = folder / file
        with safe_open(str(path), framework="pt") as f:
            metadata, state = f.metadata(), {key: f.get_tensor(key) for key in f.keys()}
        key = next(k for k, t in state.items() if t.is_floating_point() and which in k and t.numel() > 1)
        state[key] = state[key].clone()
        state[key].view(-1)[1] = value
        save_file({k: t.contiguous() for k, t in state.items()}, str(path), metadata=metadata)
        return {"bad": str(folder), "tensor": key, "_": torch.__version__}

    return setup


def remove(name: str, *files: str) -> Setup:
    def setup(paths: dict, work: Path) -> dict:
        folder = copy(paths, work, name)
        for file in files:
            target = folder / file
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        return {"bad": str(folder)}

    return setup


def chmod(name: str, file: str | None, mode: int) -> Setup:
    """Fixture ``name`` with ``file`` (or the folder itself) given ``mode`` (the case runs as nobody)."""

    def setup(paths: dict, work: Path) -> dict:
        folder = copy(paths, work, name)
        (folder / file if file else folder).chmod(mode)
        return {"bad": str(folder)}

    return setup


def write(file: str, data: bytes | str) -> Setup:
    """A file of the case's own, {bad}."""

    def setup(paths: dict, work: Path) -> dict:
        path = work / "in" / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return {"bad": str(path)}

    return setup


def shards(index: dict | str | None = None, names: tuple[str, str] = ("a.safetensors", "b.safetensors")) -> Setup:
    """hf-llama with its weights in two shards and an index: ``index`` replaces the index's weight_map (a
    dict of name -> shard, or text for the whole file)."""

    def setup(paths: dict, work: Path) -> dict:
        from safetensors.torch import load_file, save_file

        folder = copy(paths, work, "hf_llama")
        state = load_file(str(folder / "model.safetensors"))
        (folder / "model.safetensors").unlink()
        keys = sorted(state)
        half = len(keys) // 2
        save_file({k: state[k] for k in keys[:half]}, str(folder / "a.safetensors"))
        save_file({k: state[k] for k in keys[half:]}, str(folder / "b.safetensors"))
        weight_map = {k: (names[0] if i < half else names[1]) for i, k in enumerate(keys)}
        if isinstance(index, str):
            (folder / "model.safetensors.index.json").write_text(index)
        else:
            data = {"metadata": {}, "weight_map": weight_map if index is None else index}
            (folder / "model.safetensors.index.json").write_text(json.dumps(data))
        return {"bad": str(folder)}

    return setup


def pickle_bin(payload: str) -> Setup:
    """hf-gpt2 with its weights as pytorch_model.bin: "tensors" a plain state dict, "object" a pickled object
    torch's weights_only loader refuses."""

    def setup(paths: dict, work: Path) -> dict:
        import torch
        from safetensors.torch import load_file

        folder = copy(paths, work, "hf_gpt2")
        state = load_file(str(folder / "model.safetensors"))
        (folder / "model.safetensors").unlink()
        data: Any = state if payload == "tensors" else {"weights": state, "extra": Path("x")}
        torch.save(data, folder / "pytorch_model.bin")
        return {"bad": str(folder)}

    return setup


# ------------------------------------------------------------------------------------------------ GGUF


def _value_type(gguf, value: Any):
    kinds = gguf.GGUFValueType
    if isinstance(value, bool):
        return kinds.BOOL, None
    if isinstance(value, int):
        return (kinds.UINT32 if 0 <= value < 2**32 else kinds.INT64), None
    if isinstance(value, float):
        return kinds.FLOAT32, None
    if isinstance(value, str):
        return kinds.STRING, None
    first = value[0]
    element = kinds.STRING if isinstance(first, str) else kinds.FLOAT32 if isinstance(first, float) else kinds.INT32
    return kinds.ARRAY, element


def gguf(meta: dict[str, Any] | None = None, tensors: dict[str, Any] | None = None) -> Setup:
    """llama.gguf rewritten with gguf-py's writer: ``meta`` changes its metadata (DROP removes a key),
    ``tensors`` its tensors (DROP removes one, a number puts it at one place, an array replaces it)."""

    def setup(paths: dict, work: Path) -> dict:
        import gguf as gguf_py
        import numpy as np

        reader = gguf_py.GGUFReader(paths["llama_gguf"])
        values = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}
        arch = values.pop("general.architecture")
        for key, value in (meta or {}).items():
            values.pop(key, None) if value is DROP else values.__setitem__(key, value)
        arrays = {t.name: np.array(t.data).reshape(tuple(reversed([int(d) for d in t.shape]))) for t in reader.tensors}
        for name, change in (tensors or {}).items():
            if change is DROP:
                arrays.pop(name)
            elif isinstance(change, float):
                arrays[name] = arrays[name].copy()
                arrays[name].reshape(-1)[1] = change
            else:
                arrays[name] = change
        path = work / "in" / "bad.gguf"
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = gguf_py.GGUFWriter(str(path), arch)
        for key, value in values.items():
            writer.add_key_value(key, value, *_value_type(gguf_py, value))
        for name, array in arrays.items():
            writer.add_tensor(name, array)
        writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
        writer.close()
        return {"bad": str(path)}

    return setup


def gguf_bytes(edit: Callable[[bytes], bytes]) -> Setup:
    """llama.gguf with its bytes changed by ``edit`` (cut short, a wrong magic, ...)."""

    def setup(paths: dict, work: Path) -> dict:
        path = work / "in" / "bad.gguf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(edit(Path(paths["llama_gguf"]).read_bytes()))
        return {"bad": str(path)}

    return setup


# ------------------------------------------------------------------------------------------------ faults


def both(*setups: Setup) -> Setup:
    def setup(paths: dict, work: Path) -> dict:
        out: dict = {}
        for one in setups:
            out.update(one({**paths, **out}, work) or {})
        return out

    return setup


def killed(argv: list[str], after: float, *, when_exists: str | None = None, tries: int = 8) -> Setup:
    """Run ``qkv ARGV`` in a process and kill -9 it ``after`` seconds (or once a path matching the glob
    ``when_exists`` appears: a temporary file names the moment of writing). A run that ends before the moment
    (a write of a few milliseconds) is run again from an empty folder, up to ``tries`` times."""

    def setup(paths: dict, work: Path) -> dict:
        filled = [a.format(**paths, tmp=str(work)) for a in argv]
        target = when_exists.format(tmp=str(work)) if when_exists else None
        for _ in range(tries):
            shutil.rmtree(work / "cwd", ignore_errors=True)
            (work / "cwd").mkdir(parents=True)
            process = subprocess.Popen([sys.executable, "-m", "qkv", *filled], cwd=work / "cwd",
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            started = time.monotonic()
            while time.monotonic() < started + 120 and process.poll() is None:
                if glob.glob(target) if target is not None else time.monotonic() - started > after:
                    break
                time.sleep(0.001)
            process.kill()
            process.wait()
            if process.returncode == -signal.SIGKILL:  # killed at the moment, not finished before it
                break
        return {}

    return setup
