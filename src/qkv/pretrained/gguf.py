"""Loading a GGUF file as a qkv model, its tokenizer and its chat template.

    bundle = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")    # or qkv.load(...), or --model FILE.gguf
    bundle.model, bundle.tokenizer, bundle.chat_template

general.architecture picks the name table (:func:`architectures`: each family's ``gguf`` module, in its own
folder, e.g. :mod:`qkv.models.llama.gguf`); that module reads the config from the
metadata. The model is built without initialising its weights (:func:`unfilled_model`: memory reserved, not
yet touched). A matrix stored as Q4_0, Q4_1, Q4_K or Q8_0 blocks replaces its float layer by a qkv int4 or int8
layer holding the file's numbers (:mod:`qkv.pretrained.gguf_layers`), so the model keeps about the file's size
and runs on qkv's quantized kernels; every other tensor (and every one with ``dequantize=True``) is dequantized
straight into its float32 parameter. Either way the tensor's pages of the file are released afterwards.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.gguf.dequantize import dequantize, single_thread
from qkv.gguf.metadata import ArchMetadata
from qkv.gguf.names import Row, fill
from qkv.gguf.reader import GGUFFile, read_gguf
from qkv.gguf.tokenizer import tokenizer_from_gguf
from qkv.model_dir import ModelBundle
from qkv.models import GPTConfig
from qkv.models.description import GGUFConversion
from qkv.models.family import build_model, families
from qkv.models.memory import check_fits
from qkv.pretrained.gguf_layers import keep_quantized
from qkv.storage import check_finite, model_tensors


def architectures() -> dict[str, GGUFConversion]:
    """general.architecture -> the GGUF module of the family that reads it (each family declares its own)."""
    return {arch: family.gguf for family in families().values() if family.gguf for arch in family.gguf.ARCHITECTURES}


def architecture(file: GGUFFile) -> GGUFConversion:
    """The table module of the file's architecture; any other is one line naming it and what qkv reads."""
    table = architectures()
    if file.architecture not in table:
        raise QkvError(
            f"{file.path} holds a {file.architecture!r} model (general.architecture), which qkv cannot load: qkv "
            f"reads GGUF architectures {', '.join(table)}"
        )
    return table[file.architecture]


_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "xavier_uniform_",
                   "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_")  # fmt: skip
_INIT_LOCK = threading.Lock()


@contextmanager
def _uninitialised() -> Iterator[None]:
    """While building a model in this thread, torch.nn.init's functions leave tensors as they are: the weights
    are about to be overwritten, and drawing 135M random numbers costs a second and touches every page.
    Other threads keep initialising as usual. (Building on the meta device instead makes PyTorch import its
    Python decompositions, 800 modules and 75 MB, the first time a meta tensor is initialised.)"""
    owner = threading.get_ident()

    def skipping(original: Callable[..., Any]) -> Callable[..., Any]:
        def init(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            return tensor if threading.get_ident() == owner else original(tensor, *args, **kwargs)

        return init

    with _INIT_LOCK:
        originals = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS}
        for name, original in originals.items():
            setattr(nn.init, name, skipping(original))
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(nn.init, name, original)


def unfilled_model(config: GPTConfig) -> nn.Module:
    """The model of ``config`` with its weights allocated but not initialised (pages untouched, so no
    memory is used until they are filled), and its buffers (RoPE's cos/sin tables) computed."""
    with _uninitialised():
        return build_model(config)


def _shared_names(model: nn.Module) -> dict[str, list[str]]:
    """Each parameter name -> every name of that parameter (W_U and W_E when tied)."""
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return {name: names for names in by_id.values() for name in names}


def _match(rows: list[tuple[re.Pattern[str], Row]], name: str) -> tuple[Row, str | None] | None:
    for pattern, row in rows:
        found = pattern.fullmatch(name)
        if found:
            return row, found.groupdict().get("i")
    return None


def _values(file: GGUFFile, row: Row, name: str, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The qkv tensors GGUF tensor ``name`` becomes: dequantized straight into the parameter when copied as
    it is, else dequantized and transformed (W_q's rows reordered, GPT-2's attn_qkv split)."""
    raw = file.raw(name)
    if row.plain and len(params) == 1 and tuple(raw.shape) == tuple(params[0].shape):
        return [dequantize(raw, params[0].data)]
    try:
        values = list(row.to_qkv(dequantize(raw)))
    except (ValueError, RuntimeError) as error:
        raise QkvError(f"tensor {name} of shape {list(raw.shape)} does not fit the metadata ({error})") from None
    return values


def fill_model(
    model: nn.Module, file: GGUFFile, rows: list[Row], ignored: tuple[str, ...] = (), *, dequantize: bool = True
) -> nn.Module:
    """Fill ``model`` (built by :func:`unfilled_model`) with every tensor of ``file`` through ``rows``: its
    quantized matrices as int4 and int8 layers unless ``dequantize``, the rest dequantized into the parameters.
    A tensor no row names, a missing tensor or a shape that differs is one line naming the GGUF tensor."""
    compiled = [(row.pattern(), row) for row in rows]
    shared, params = _shared_names(model), dict(model.named_parameters(remove_duplicate=False))
    done: set[str] = set()
    kept: list[nn.Module] = []
    for name in file.tensors:
        found = _match(compiled, name)
        if found is None:
            if any(re.fullmatch(p, name) for p in ignored):
                continue
            raise QkvError(f"the file holds tensor {name}, which qkv's {file.architecture} table does not know")
        row, block = found
        targets = [fill(target, block) for target in row.qkv]
        if any(target not in params for target in targets):
            raise QkvError(f"tensor {name} has no place in the model the metadata describes (block_count?)")
        layers = None if dequantize else keep_quantized(model, file.raw(name), row, targets)
        if layers is not None:
            kept += layers
            done.update(alias for target in targets for alias in shared[target])
            file.release(name)
            continue
        values = _values(file, row, name, [params[t] for t in targets])
        for target, value in zip(targets, values, strict=True):
            if value.shape != params[target].shape:
                raise QkvError(
                    f"tensor {name} gives shape {list(value.shape)} but qkv {target} needs "
                    f"{list(params[target].shape)}: the tensors do not match the metadata; convert the model again"
                )
            if value is not params[target].data:
                params[target].data.copy_(value)
            done.update(shared[target])
        file.release(name)
    done.update(_quantized_names(model, kept))
    _check_complete(model, rows, done)
    return model


def _quantized_names(model: nn.Module, layers: list[nn.Module]) -> set[str]:
    """The names of the quantized layers' levels and scales (filled from their blocks), under every module
    holding them (a tied embedding holds the unembedding's)."""
    tensors = {id(p) for layer in layers for name, p in layer.named_parameters() if name != "bias"}
    return {name for name, p in model.named_parameters(remove_duplicate=False) if id(p) in tensors}


def _check_complete(model: nn.Module, rows: list[Row], done: set[str]) -> None:
    """QkvError naming the GGUF tensor behind the first parameter no tensor filled."""
    for name, _ in model.named_parameters():
        if name in done:
            continue
        for row in rows:
            for target in row.qkv:
                found = re.fullmatch(re.escape(target).replace(r"\{i\}", r"(?P<i>\d+)"), name)
                if found:
                    wanted = fill(row.gguf, found.groupdict().get("i"))
                    raise QkvError(f"the file lacks tensor {wanted} (qkv {name}): the file is incomplete")
        raise QkvError(f"no tensor of the file fills qkv {name}: the file is incomplete")


def load_gguf(path: str | Path, *, device: str | torch.device = "cpu", dequantize: bool = False) -> ModelBundle:
    """A GGUF file as a qkv model (eval mode, on ``device``) with its tokenizer and chat template: its Q4_0, Q4_1,
    Q4_K and Q8_0 matrices as int4 and int8 layers, the rest float32; every tensor float32 with ``dequantize``
    (the file's exact numbers, as transformers reads them)."""
    file = read_gguf(path)
    module = architecture(file)
    arch = file.architecture
    assert arch is not None  # architecture() refused a file without one
    try:
        config = cast(GPTConfig, module.config_from_gguf(ArchMetadata(file.metadata, arch), file))  # a decoder's
        tokenizer = tokenizer_from_gguf(file.metadata)
        if tokenizer.vocab_size != config.vocab_size:
            raise QkvError(
                f"the tokenizer has {tokenizer.vocab_size} tokens but the model {config.vocab_size} rows of W_E"
            )
        check_fits(config, device)  # block_count 10^8: the figure, before anything is built
        with single_thread():
            rows = module.rows(config, arch)
            model = fill_model(unfilled_model(config), file, rows, module.IGNORED, dequantize=dequantize)
        check_finite(model_tensors(model), "the file", "the file is damaged; download or convert it again")
    except QkvError as error:
        raise QkvError(f"{file.path}: {error}") from None
    model.to(device)
    model.eval()
    template = file.metadata.get("tokenizer.chat_template")
    return ModelBundle(
        model=model,
        config=config,
        tokenizer=tokenizer,
        target_tokenizer=None,
        path=file.path,
        chat_template=template if isinstance(template, str) else None,
    )
