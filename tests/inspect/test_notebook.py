"""Every view's result shows itself in a notebook: ``_repr_html_`` holds the real numbers, ``_repr_png_`` is the
CLI's picture as PNG bytes, and the interactive views are their offline pages inside an iframe."""

from __future__ import annotations

import html
import json
import re
import struct

import numpy as np
import pytest

from qkv.inspect import (
    attention_maps,
    attribute,
    detect_heads,
    explain_model,
    logit_lens,
    next_token,
    patch,
    walkthrough,
)
from qkv.inspect.embedding_views import analogy, embedding_map, neighbours, positions


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def text_of(output: str) -> str:
    """The output with tags removed and entities decoded: what a reader sees (and its numbers)."""
    return html.unescape(re.sub(r"<[^>]+>", " ", output))


def frame_page(output: str) -> str:
    """The page inside the output's <iframe srcdoc="...">."""
    found = re.search(r'srcdoc="([^"]*)"', output)
    assert found, "no iframe srcdoc in the output"
    return html.unescape(found.group(1))


def page_data(page: str, element: str) -> dict:
    found = re.search(rf'<script type="application/json" id="{element}">(.*?)</script>', page, re.S)
    assert found
    return json.loads(found.group(1).replace("<\\/", "</"))


def test_next_token_shows_the_top_token_and_its_probability(gpt) -> None:
    result = next_token(gpt, "the quick", temperatures=(0.5, 1.0))
    seen = text_of(result._repr_html_())
    assert result.top_tokens[0] in seen
    assert f"{result.top_probabilities[1, 0]:.4f}" in seen  # T = 1, the likeliest token
    assert f"{result.top_probabilities[0, 0]:.4f}" in seen  # T = 0.5
    width, height = png_size(result._repr_png_())
    assert width > 300 and height > 150
    assert "data:image/png;base64," in result._repr_html_()  # the same picture inline


def test_attention_is_the_interactive_page_in_an_iframe(gpt) -> None:
    maps = attention_maps(gpt, "the fox")
    first, second = maps._repr_html_(), maps._repr_html_()
    assert first.startswith("<iframe") and "cdn" not in first.lower() and 'src="http' not in first
    ids = [re.search(r'id="([^"]+)"', out).group(1) for out in (first, second)]
    assert ids[0] != ids[1]  # two outputs in one notebook never share an id
    page = frame_page(first)
    assert 'id="group"' in page and 'id="head"' in page and "mouseenter" in page  # the head picker, hover
    weights = page_data(page, "attention-data")["groups"]["decoder"]["weights"]
    assert np.allclose(weights, maps.groups["decoder"].weights, atol=1e-4)
    width, height = png_size(maps._repr_png_())
    assert width > 300 and height > 300


def test_a_translators_attention_picture_is_its_cross_attention(translator) -> None:
    maps = attention_maps(translator, "3 may", target="2021")
    assert maps.main_group().name == "cross"
    assert maps._repr_png_() == maps.groups["cross"]._repr_png_()
    assert png_size(maps._repr_png_())[0] > 300


def test_explanation_prints_every_step_as_qkv_explain_does(gpt) -> None:
    e = explain_model(gpt, "the fox", layer=1, head=1)
    seen = text_of(e._repr_html_())
    assert "Causal mask" in seen and "-inf" in seen and "Softmax" in seen
    assert f"{e.weights[3, 1]:.4f}" in seen and f"{e.scaled[2, 0]:.4f}" in seen


def test_logit_lens_shows_each_rows_top_token(gpt) -> None:
    lens = logit_lens(gpt, "the quick")
    seen = text_of(lens._repr_html_())
    assert repr(lens.final_tokens[-1]) in seen
    assert f"{lens.final_probs[-1, -1]:.4f}" in seen and f"{lens.top_probs[0, -1, 0]:.4f}" in seen
    assert png_size(lens._repr_png_())[0] > 300


def test_attribution_shows_the_logit_and_its_parts(gpt) -> None:
    result = attribute(gpt, "the quick")
    seen = text_of(result._repr_html_())
    assert f"{result.logit:.4f}" in seen and f"{result.terms()[1][1]:.4f}" in seen
    assert png_size(result._repr_png_())[0] > 300


def test_patching_shows_the_differences(gpt) -> None:
    result = patch(gpt, "the fox", "the dog", target="x", foil="y")
    seen = text_of(result._repr_html_())
    assert f"{result.clean_difference:.4f}" in seen and f"{result.corrupt_difference:.4f}" in seen
    assert png_size(result._repr_png_())[0] > 300


def test_head_scores_show_the_best_heads(gpt) -> None:
    detection = detect_heads(gpt, length=6, batch=2)
    part = detection.parts[0]
    name = next(iter(part.scores))
    seen = text_of(detection._repr_html_())
    assert f"{part.top(name, 1)[0][2]:.4f}" in seen
    assert png_size(detection._repr_png_())[1] > 150


def test_walkthrough_is_the_offline_page_with_live_temperature(gpt) -> None:
    walk = walkthrough(gpt, "the fox", vocab=True)
    page = frame_page(walk._repr_html_())
    assert "QkvWalkthrough" in page and "localProbabilities" in page  # the playground's script, inlined
    data = page_data(page, "walkthrough-data")
    assert data["tokens"] == walk.tokens and len(data["logits"]) == len(walk.logits)
    without = walkthrough(gpt, "the fox")._repr_html_()  # no vocabulary labels: the lens of the same pass
    assert "<iframe" not in without and "vocab=True" in without


def test_embedding_views(gpt) -> None:
    found = neighbours(gpt, "e", k=3)
    seen = text_of(found._repr_html_())
    assert len(found.answers) == 3 and f"{found.answers[0][1]:.4f}" in seen and repr(found.answers[0][0]) in seen
    assert "cosine" in text_of(analogy(gpt, "a", "b", "c", k=2)._repr_html_())
    picture = embedding_map(gpt, top=10)
    assert png_size(picture._repr_png_())[0] > 300 and "%" in text_of(picture._repr_html_())
    table = positions(gpt, length=16)
    assert table.table.shape == (16, 16) and png_size(table._repr_png_())[0] > 200


def test_the_picture_is_drawn_once_per_result(gpt, monkeypatch) -> None:
    from qkv.inspect import notebook

    result = logit_lens(gpt, "the")
    calls = []
    real = notebook.png_bytes
    monkeypatch.setattr(notebook, "png_bytes", lambda *a, **k: calls.append(1) or real(*a, **k))
    import qkv.inspect.circuit_views as views

    monkeypatch.setattr(views, "png_bytes", notebook.png_bytes)
    result._repr_html_()
    result._repr_png_()
    assert len(calls) == 1


@pytest.mark.parametrize("make", [lambda b: next_token(b, "the"), lambda b: logit_lens(b, "the")])
def test_outputs_carry_no_links_to_the_network(gpt, make) -> None:
    assert not re.search(r"(src|href)=\"https?:", make(gpt)._repr_html_())


def test_every_result_prints_as_one_short_line(gpt) -> None:
    text = "the quick"
    results = [next_token(gpt, "the qu"), logit_lens(gpt, text), attention_maps(gpt, text), attribute(gpt, text),
               walkthrough(gpt, text, vocab=True), detect_heads(gpt, length=4)]  # fmt: skip
    for result in results:
        line = repr(result)
        assert "\n" not in line and len(line) < 1200, line
        assert line.startswith(type(result).__name__ + "(")
    assert "probabilities=array(3, " in repr(results[0]) and "top_tokens=list(3 x 9 x 5)" in repr(results[1])


def test_drawing_a_view_leaves_matplotlib_s_backend_as_it_was(gpt) -> None:
    """A notebook's inline backend must survive a qkv picture (the figures are made without pyplot)."""
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # any backend that is not Agg, standing for the notebook's
    try:
        assert logit_lens(gpt, "the quick")._repr_png_()[:4] == b"\x89PNG"
        assert next_token(gpt, "the qu")._repr_png_()[:4] == b"\x89PNG"
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)


def test_the_training_progress_line(capsys) -> None:
    from types import SimpleNamespace

    from qkv.inspect.notebook import progress_line

    trainer = SimpleNamespace(config=SimpleNamespace(steps=45))
    on_step = progress_line("training", every=20)
    for step in range(1, 46):
        on_step(trainer, step, np.float64(2.5 - step / 100))
    lines = capsys.readouterr().out.splitlines()  # outside IPython: printed
    assert [line.split(",")[0] for line in lines] == [f"training: step {n} of 45" for n in (20, 40, 45)]
    assert "loss 2.300" in lines[0] and "s to go" in lines[0] and lines[-1].endswith(", done")
