"""Fixtures shared by the command-line tests."""

from __future__ import annotations

import pytest
import torch

from qkv.cli import main
from qkv.model_dir import save_model_dir
from qkv.models import GPT, GPTConfig, Transformer, TransformerConfig
from qkv.tokenizers import CharTokenizer
from tests.cli.test_bad_input import GOOD_TEXT, train_args


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A gpt-nano run trained for 4 steps on a small text (data.txt beside it), by `qkv train` itself."""
    root = tmp_path_factory.mktemp("tiny")
    data = root / "data.txt"
    data.write_text(GOOD_TEXT)
    assert main(train_args(data, root / "run")) == 0
    return root / "run"


def gpt_and_translator(root, gpt_context: int = 32):
    """Run folders of an untrained tiny GPT and translator (char vocabulary), saved under ``root``."""
    tok = CharTokenizer.train("the quick brown fox jumps over the lazy dog")
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=2, context_length=gpt_context))
    translator = Transformer(TransformerConfig(
        src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_encoder_layers=1,
        n_decoder_layers=1, context_length=24,
    ))  # fmt: skip
    return save_model_dir(root / "gpt", gpt, tok), save_model_dir(root / "translator", translator, tok)


from tests.server.conftest import gpt_run  # noqa: E402, F401  (the session fixture test_serve.py uses: a tiny trained GPT run)
