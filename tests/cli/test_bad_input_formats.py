"""Bad input in the newer formats gets what a run folder gets: one line naming the problem and the fix, exit code 2.
Hugging Face folders, GGUF files and quantized folders are checked as they load: weights that are not numbers
(naming the tensor), config values of the wrong type or zero, a tokenizer larger than the embedding, sizes beyond
memory, shard names that leave the folder; through `qkv` itself (docs/errors.md, "The newer surface")."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from qkv.cli import main
from tests.cli.test_bad_input import assert_one_line_error, refused, run_cli
from tests.pretrained.conftest import gpt2_dir, need_transformers, save_llama  # noqa: F401  (a session fixture)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    need_transformers()
    folder = tmp_path_factory.mktemp("hf") / "llama"
    save_llama(folder, tie_word_embeddings=True)
    return folder


@pytest.fixture(scope="module")
def gguf_file(llama_dir, tmp_path_factory) -> Path:
    pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("gguf") / "llama.gguf"
    assert main(["export", "--model", str(llama_dir), "--gguf", str(path), "--gguf-type", "f32"]) == 0
    return path


@pytest.fixture(scope="module")
def quantized(tiny_run, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantized")
    out = {}
    for name, flags in (("int8", []), ("int4", ["--bits", "4", "--group-size", "32"])):
        assert main(["quantize", str(tiny_run), "--out", str(root / name), *flags]) == 0
        out[name] = root / name
    return out


def copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name, ignore=shutil.ignore_patterns("checkpoints")))


def edit_config(folder: Path, **changes) -> Path:
    data = json.loads((folder / "config.json").read_text())
    data.update(changes)
    (folder / "config.json").write_text(json.dumps(data))
    return folder


def spoil(path: Path, value: float, which: str = "") -> str:
    """Put ``value`` at one place of the first floating tensor of the safetensors file whose name holds ``which``;
    return that tensor's name."""
    with safe_open(str(path), framework="pt") as f:
        metadata, state = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    name = next(k for k, t in state.items() if t.is_floating_point() and which in k and t.numel() > 1)
    state[name] = state[name].clone()
    state[name].view(-1)[1] = value
    save_file(state, str(path), metadata=metadata)
    return name


GENERATE = ["generate", "--max-new-tokens", "3", "--temperature", "0"]


@pytest.mark.parametrize(("value", "what"), [(math.nan, "NaN"), (math.inf, "infinite values")])
def test_a_hugging_face_folder_whose_weights_are_not_numbers(llama_dir, tmp_path, capsys, value, what) -> None:
    folder = copy(llama_dir, tmp_path)
    name = spoil(folder / "model.safetensors", value, which="mlp")
    for verb in (GENERATE, ["quantize", "--out", str(tmp_path / "q")], ["export", "--gguf", str(tmp_path / "m.gguf")]):
        refused(capsys, [*verb, "--model", str(folder)], f"tensor {name} in the weights of {folder} holds {what}")
    assert not (tmp_path / "q").exists() and not (tmp_path / "m.gguf").exists()


def test_a_gguf_file_whose_weights_are_not_numbers(gguf_file, tmp_path, capsys) -> None:
    from gguf import GGUFReader

    spoilt = tmp_path / "bad.gguf"
    shutil.copy(gguf_file, spoilt)
    tensor = next(t for t in GGUFReader(str(spoilt), "r+").tensors if t.name == "blk.0.ffn_up.weight")
    tensor.data.reshape(-1)[1] = math.nan  # written through gguf-py's own map of the file
    del tensor
    refused(
        capsys,
        [*GENERATE, "--model", str(spoilt)],
        "decoder.blocks.0.feed_forward.linear1.weight in the file holds NaN",
    )
    refused(capsys, ["chat", str(spoilt)], "holds NaN")


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_quantized_folder_whose_scales_are_not_numbers(quantized, tmp_path, capsys, scheme) -> None:
    folder = copy(quantized[scheme], tmp_path)
    name = spoil(folder / "model.safetensors", math.nan, which="scale")
    refused(capsys, [*GENERATE, str(folder)], f"hold NaN (tensor {name}): quantize the original run again")


@pytest.mark.parametrize(
    ("key", "value"),
    [("num_attention_heads", 0), ("num_attention_heads", "2"), ("hidden_size", "64"), ("num_hidden_layers", -1),
     ("num_key_value_heads", 0), ("rms_norm_eps", 0), ("rope_theta", 0), ("rope_theta", -5.0), ("vocab_size", 0),
     ("tie_word_embeddings", "yes"), ("max_position_embeddings", 1e8), ("attention_dropout", 5)],
)  # fmt: skip
def test_config_values_of_the_wrong_type_or_zero(llama_dir, tmp_path, capsys, key, value) -> None:
    folder = edit_config(copy(llama_dir, tmp_path), **{key: value})
    refused(capsys, [*GENERATE, "--model", str(folder)], f"sets {key}={json.dumps(value)}, which must be")


def test_gpt2_config_values_of_the_wrong_type(gpt2_dir, tmp_path, capsys) -> None:  # noqa: F811
    for key, value in (("n_embd", "64"), ("n_head", 0), ("layer_norm_epsilon", "x"), ("n_inner", -5)):
        folder = edit_config(copy(gpt2_dir, tmp_path / key), **{key: value})
        refused(capsys, [*GENERATE, "--model", str(folder)], f"sets {key}={json.dumps(value)}, which must be")


def test_a_tokenizer_larger_than_the_embedding(llama_dir, tmp_path, capsys) -> None:
    folder = copy(llama_dir, tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    state = {k: (t[:200].contiguous() if "embed_tokens" in k or "lm_head" in k else t) for k, t in state.items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    edit_config(folder, vocab_size=200)
    message = "the tokenizer has 300 tokens but config.json gives the embedding 200 rows (vocab_size)"
    refused(capsys, ["lens", "--model", str(folder), "hello", "--out", str(tmp_path / "l.png")], message)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [({"num_hidden_layers": 10**8}, "parameters need"), ({"max_position_embeddings": 10**12}, "its tables of")],
)
def test_sizes_beyond_memory_are_refused_before_anything_is_built(llama_dir, tmp_path, capsys, changes, fragment):
    folder = edit_config(copy(llama_dir, tmp_path), **changes)
    refused(capsys, [*GENERATE, "--model", str(folder)], fragment)


def shard(folder: Path, names: tuple[str, str] = ("a.safetensors", "b.safetensors"), weight_map=None) -> Path:
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    keys = sorted(state)
    half = len(keys) // 2
    for part, chunk in (("a.safetensors", keys[:half]), ("b.safetensors", keys[half:])):
        save_file({k: state[k] for k in chunk}, str(folder / part))
    default = {k: names[0] if i < half else names[1] for i, k in enumerate(keys)}
    index = {"weight_map": default if weight_map is None else weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def test_sharded_weights_load_and_bad_indexes_are_one_line(llama_dir, tmp_path, capsys) -> None:
    assert run_cli(capsys, *GENERATE, "--model", str(shard(copy(llama_dir, tmp_path / "good"))))[0] == 0
    outside = copy(llama_dir, tmp_path / "escape")
    shutil.copy(llama_dir / "model.safetensors", tmp_path / "escape" / "x.safetensors")
    escape = shard(outside, names=("../x.safetensors", "b.safetensors"))
    refused(
        capsys, [*GENERATE, "--model", str(escape)], "names the shard '../x.safetensors', outside the model's folder"
    )
    for weight_map in (["a.safetensors"], "a.safetensors", {"x": 5}):
        folder = shard(copy(llama_dir, tmp_path / f"map{len(str(weight_map))}"), weight_map=weight_map)
        refused(capsys, [*GENERATE, "--model", str(folder)], "its weight_map must map each tensor name to a shard")


def test_a_pickled_pytorch_model_bin_is_refused_in_one_line(gpt2_dir, tmp_path, capsys) -> None:  # noqa: F811
    folder = copy(gpt2_dir, tmp_path)
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save({"weights": state, "extra": Path("x")}, folder / "pytorch_model.bin")
    code, err = run_cli(capsys, *GENERATE, "--model", str(folder))
    assert_one_line_error(code, err, "holds Python objects besides tensors, which qkv never unpickles")
    assert "weights_only" not in err


def test_a_temperature_that_rounds_to_zero_is_greedy(gguf_file, capsys) -> None:
    outputs = []
    for temperature in ("0", "1e-300", "5e-324"):
        code = main(["generate", "--model", str(gguf_file), "--prompt", "the", "--max-new-tokens", "6",
                     "--temperature", temperature])  # fmt: skip
        outputs.append((code, capsys.readouterr().out))
    assert outputs[0][0] == 0 and outputs[1] == outputs[0] == outputs[2]


def test_a_quantize_killed_after_its_weights_landed_is_finished_by_the_same_command(tiny_run, tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["quantize", str(tiny_run), "--out", str(out)]) == 0
    (out / "config.json").unlink()  # killed between the weights and the config.json that is written last
    code, err = run_cli(capsys, "quantize", str(tiny_run), "--out", str(out))
    assert code == 0 and "stopped before its config.json was written: replacing it" in err
    assert (out / "config.json").is_file() and run_cli(capsys, *GENERATE, str(out))[0] == 0
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")  # a folder of someone's own files is still refused
    refused(capsys, ["quantize", str(tiny_run), "--out", str(tmp_path / "other")], "already holds other files")
