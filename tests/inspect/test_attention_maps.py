"""Attention maps are the model's own weights (rows sum to 1), drawn as the expected grid and HTML page."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from qkv.errors import QkvError
from qkv.inspect import attention_html, attention_maps, draw_attention, png_size
from qkv.layers.capture import capture
from qkv.model_dir import ModelBundle
from qkv.models import GPT, GPTConfig
from qkv.tokenizers import CharTokenizer


def test_gpt_maps_sum_to_one_and_equal_a_capture_of_the_model(gpt) -> None:
    maps = attention_maps(gpt, "the quick fox")
    assert list(maps.groups) == ["decoder"]
    group = maps.groups["decoder"]
    assert group.weights.shape == (2, 2, 13, 13) and group.causal
    np.testing.assert_allclose(group.weights.sum(axis=-1), 1.0, atol=1e-6)
    assert np.all(np.triu(group.weights, k=1) == 0)  # causal: no weight on later tokens
    with capture(gpt.model) as acts:
        gpt.model(torch.tensor([gpt.tokenizer.encode("the quick fox")]))
    for layer in range(2):
        np.testing.assert_array_equal(
            group.weights[layer], acts[f"decoder.blocks.{layer}.self_attn.weights"][0].double().numpy()
        )
    assert group.query_tokens == group.key_tokens == list("the␣quick␣fox")


def test_maps_equal_multihead_attention_need_weights() -> None:
    """A post-LN GPT: block 0's attention input is the embedding output, block 1's is block 0's output."""
    torch.manual_seed(3)
    tok = CharTokenizer.train("abcdefgh")
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, d_model=12, n_heads=3, n_layers=2, context_length=16,
                          norm_first=False, positional="sinusoidal"))  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    model.eval()
    bundle = ModelBundle(model, model.config, tok, None, None)
    maps = attention_maps(bundle, "abcabchg")
    ids = torch.tensor([tok.encode("abcabchg")])
    with torch.no_grad():
        x = model.embedding(ids)
        for layer, block in enumerate(model.decoder.blocks):
            _, weights = block.self_attn(x, causal=True, need_weights=True)  # (1, h, T, T)
            np.testing.assert_allclose(maps.groups["decoder"].weights[layer], weights[0].double().numpy(), atol=1e-6)
            x = block(x)


def test_a_translator_has_three_kinds_of_maps(translator) -> None:
    maps = attention_maps(translator, "the fox", target="over")
    assert list(maps.groups) == ["encoder", "decoder", "cross"]
    source, target = list("the␣fox"), ["<bos>", "o", "v", "e", "r"]
    enc, dec, cross = (maps.groups[n] for n in ("encoder", "decoder", "cross"))
    assert enc.weights.shape == (1, 2, 7, 7) and enc.query_tokens == enc.key_tokens == source
    assert dec.weights.shape == (2, 2, 5, 5) and dec.query_tokens == dec.key_tokens == target and dec.causal
    assert cross.weights.shape == (2, 2, 5, 7) and cross.query_tokens == target and cross.key_tokens == source
    for group in maps.groups.values():
        np.testing.assert_allclose(group.weights.sum(axis=-1), 1.0, atol=1e-6)
    assert np.all(np.triu(dec.weights, k=1) == 0) and np.all(enc.weights > 0)


def test_a_translator_without_a_target_uses_its_greedy_translation(translator) -> None:
    from qkv.decoding.beam_search import greedy_decode

    maps = attention_maps(translator, "the fox")
    tok = translator.tokenizer
    out = greedy_decode(translator.model, torch.tensor([tok.encode("the fox")]), bos_id=tok.bos_id, eos_id=tok.eos_id)
    assert maps.generated and maps.target_tokens[0] == "<bos>"
    assert len(maps.target_tokens) == 1 + len(out[0])
    assert maps.groups["cross"].weights.shape[2] == len(maps.target_tokens)


@pytest.mark.parametrize(
    "layer,head,panels,rows,columns", [(None, None, 4, 2, 2), (1, None, 2, 1, 2), (None, 0, 2, 2, 1), (0, 1, 1, 1, 1)]
)
def test_the_grid_has_one_panel_per_layer_and_head(gpt, tmp_path, layer, head, panels, rows, columns) -> None:
    group = attention_maps(gpt, "the quick fox").groups["decoder"]
    picture = draw_attention(group, tmp_path / "a.png", layer=layer, head=head)
    assert (picture.panels, picture.rows, picture.columns) == (panels, rows, columns)
    width, height = png_size(picture.path)
    assert (width, height) == (picture.width, picture.height)
    assert 300 < width < 2600 and 250 < height < 3200
    assert picture.path.stat().st_size < 300_000


def test_several_layers_and_heads_make_one_labelled_grid(gpt, tmp_path) -> None:
    group = attention_maps(gpt, "the quick fox").groups["decoder"]
    picture = draw_attention(group, tmp_path / "a.png", layer=[1, 0], head=range(2))
    assert (picture.panels, picture.rows, picture.columns) == (4, 2, 2)
    assert group.select([1, 0], [1]) == ([1, 0], [1])
    with pytest.raises(QkvError, match="--layer 5 is out of range"):
        group.select([0, 5], None)
    with pytest.raises(QkvError, match="no layer or no head to draw"):
        group.select([], None)


def test_thirty_layers_of_nine_heads_make_one_picture(tmp_path) -> None:
    """SmolLM2's grid: 270 maps in one image of at most ~2600 x 3300 pixels (one mosaic: about 2 s, not 13)."""
    from qkv.inspect.attention_maps import AttentionGroup

    weights = np.random.default_rng(0).dirichlet(np.ones(5), size=(30, 9, 5))  # (L, H, T, T), rows sum to 1
    tokens = ["The", " capital", " of", " France", " is"]
    group = AttentionGroup("decoder", "masked self-attention", True, weights, tokens, tokens)
    picture = draw_attention(group, tmp_path / "a.png")
    assert (picture.panels, picture.rows, picture.columns) == (270, 30, 9)
    assert picture.width < 2600 and picture.height < 3300


def test_layer_and_head_out_of_range_are_errors(gpt, tmp_path) -> None:
    group = attention_maps(gpt, "the fox").groups["decoder"]
    with pytest.raises(QkvError, match="--layer 2 is out of range"):
        draw_attention(group, tmp_path / "a.png", layer=2)
    with pytest.raises(QkvError, match="--head 5 is out of range"):
        draw_attention(group, tmp_path / "a.png", head=5)
    assert not (tmp_path / "a.png").exists()


def test_png_size_rejects_other_files(tmp_path) -> None:
    (tmp_path / "x.png").write_text("not a picture")
    with pytest.raises(QkvError, match="not a PNG"):
        png_size(tmp_path / "x.png")


def test_the_html_page_is_standalone_and_holds_the_tokens_and_weights(translator) -> None:
    maps = attention_maps(translator, "the fox", target="over")
    page = attention_html(maps)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, flags=re.I)
    assert "http" not in page and "<link" not in page
    data = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page, re.S).group(1)
    parsed = json.loads(data)
    assert set(parsed["groups"]) == {"encoder", "decoder", "cross"}
    cross = parsed["groups"]["cross"]
    assert cross["key_tokens"] == list("the␣fox") and cross["query_tokens"] == ["<bos>", "o", "v", "e", "r"]
    np.testing.assert_allclose(np.array(cross["weights"]), maps.groups["cross"].weights, atol=1e-4)
    assert "t h e ␣ f o x" in page  # the source sentence as tokens
    assert page.count("<script") == 2 and "mouseenter" in page  # the data block and the inline script


def test_a_token_that_looks_like_a_closing_tag_cannot_end_the_data_block(translator) -> None:
    maps = attention_maps(translator, "the fox", target="over")
    maps.groups["encoder"].query_tokens[0] = "</script><b>"
    page = attention_html(maps)
    data = re.search(r'id="attention-data">(.*?)</script>', page, re.S).group(1)
    assert json.loads(data)["groups"]["encoder"]["query_tokens"][0] == "</script><b>"
