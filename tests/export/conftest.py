"""Tiny models of each kind saved as run folders and exported with `qkv export`, once per test session.

Every parameter is perturbed (biases and LayerNorm gains too), so that a tensor left out of the graph or
read in the wrong place changes the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from qkv.cli import main
from qkv.model_dir import ModelBundle, load_model_dir, save_model_dir
from qkv.models import GPT, Encoder, EncoderConfig, GPTConfig, Transformer, TransformerConfig
from qkv.tokenizers import CharTokenizer

TEXT = "the quick brown fox jumps over the lazy dog. a man is eating food. the girl carries a baby.\n"


@dataclass
class Exported:
    bundle: ModelBundle  # the model as qkv loads it from the run folder
    files: list[Path]


def perturb(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    return model.eval()


def export(root: Path, name: str, model: torch.nn.Module, tokenizer) -> Exported:
    run = save_model_dir(root / name, perturb(model), tokenizer)
    assert main(["export", str(run), "--onnx", str(root / f"{name}.onnx")]) == 0
    files = sorted(root.glob(f"{name}*.onnx"))
    return Exported(load_model_dir(run), files)


@pytest.fixture(scope="session")
def tokenizer() -> CharTokenizer:
    return CharTokenizer.train(TEXT)


@pytest.fixture(scope="session")
def onnx_root(tmp_path_factory) -> Path:
    for package in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(package, reason="the ONNX tests need onnx, onnxscript and onnxruntime (the test extra)")
    return tmp_path_factory.mktemp("onnx")


@pytest.fixture(scope="session")
def gpt_onnx(onnx_root, tokenizer) -> Exported:
    """GPT-2's layout: learned positions, pre-LN, tied W_U = W_E^T."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, n_layers=2, context_length=40))
    return export(onnx_root, "gpt", model, tokenizer)


@pytest.fixture(scope="session")
def encoder_onnx(onnx_root, tokenizer) -> Exported:
    """BERT's layout: post-LN, learned positions, segment embeddings, LayerNorm on the embeddings."""
    torch.manual_seed(1)
    config = EncoderConfig(
        vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, n_layers=1, context_length=40, norm_first=False,
        type_vocab_size=2, embedding_norm=True,
    )  # fmt: skip
    return export(onnx_root, "encoder", Encoder(config), tokenizer)


@pytest.fixture(scope="session")
def translator_onnx(onnx_root, tokenizer) -> Exported:
    """Rotary positions, one embedding for both sides tied to W_U, and a logits bias (Marian's)."""
    torch.manual_seed(2)
    config = TransformerConfig(
        src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4,
        n_encoder_layers=1, n_decoder_layers=2, context_length=40, positional="rope", share_embeddings=True,
        final_logits_bias=True,
    )  # fmt: skip
    return export(onnx_root, "translator", Transformer(config), tokenizer)
