"""The lens, attribution, patching and head-score pictures: one PNG each, with the panels the results hold."""

from __future__ import annotations

import pytest

from qkv.inspect import png_size
from qkv.inspect.attribution import attribute
from qkv.inspect.circuit_figures import draw_attribution, draw_head_scores, draw_logit_lens, draw_patching
from qkv.inspect.heads import detect_heads
from qkv.inspect.lens import logit_lens
from qkv.inspect.patching import patch
from qkv.model_dir import ModelBundle
from qkv.models import GPT, GPTConfig


def test_every_picture_is_a_png_with_its_panels(gpt, translator, char_tokenizer, tmp_path) -> None:
    lens = logit_lens(gpt, "the quick brown fox")
    picture = draw_logit_lens(lens, tmp_path / "lens.png", color="top")
    assert picture.panels == 1 and png_size(picture.path) == (picture.width, picture.height)
    assert 600 <= picture.width <= 2400 and 300 <= picture.height <= 2000
    model = GPT(GPTConfig(vocab_size=char_tokenizer.vocab_size, d_model=8, n_heads=2, n_layers=1, context_length=64))
    wide = ModelBundle(model.eval(), model.config, char_tokenizer, None, None)
    long = logit_lens(wide, "the quick brown fox jumps over the lazy dog.")  # too many cells to write tokens in
    assert draw_logit_lens(long, tmp_path / "long.png").width <= 2400
    with pytest.raises(ValueError, match="color must be"):
        draw_logit_lens(lens, tmp_path / "x.png", color="blue")
    picture = draw_attribution(attribute(gpt, "the quick"), tmp_path / "attribution.png")
    assert (picture.panels, picture.columns) == (2, 2)
    picture = draw_patching(patch(gpt, "the quick", "the quack", foil="z"), tmp_path / "patch.png")
    assert (picture.panels, picture.columns) == (2, 2)
    picture = draw_patching(patch(translator, "the fox", "the fix", foil="z"), tmp_path / "patch-translator.png")
    assert picture.panels == 5  # encoder residual and heads, decoder residual and heads, cross heads
    picture = draw_head_scores(detect_heads(translator, length=5), tmp_path / "heads.png")
    assert (picture.panels, picture.rows, picture.columns) == (8, 2, 4)
