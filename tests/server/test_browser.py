"""The playground in a real browser: headless Chromium (Debian's ``chromium`` package) driven by Playwright.

It loads the page, types a prompt, moves the temperature slider and sees the chart change, generates and sees
tokens arrive, opens the attention view, and does the same for a translator. Screenshots are saved to
test-artifacts/server/ at the top of the checkout. Without /usr/bin/chromium or the playwright package the
tests skip and say so (.ci/run installs both): tests/server/browser_page.py. The walk-through is
test_browser_walkthrough.py's, the chat panel test_browser_chat.py's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.server.browser_page import screenshot


def attention_shown(page) -> None:
    """Wait until the attention view has answered (a session's server may still be finishing an earlier test's
    generation on its model thread: more than 90 s when the suite shares 2 cores with two other busy processes),
    and say why if it did not draw."""
    answered = (
        "() => { const s = document.getElementById('attention-view').dataset.state; "
        "return s === 'shown' || s === 'error' ? s : null; }"
    )  # read once: a later update may set it loading again
    state = page.wait_for_function(answered, timeout=240_000).json_value()
    assert state == "shown", page.inner_text("#attention-description")


def chart(page) -> tuple[int, list[str]]:
    """The chart's render count and its percentages, top to bottom."""
    version = int(page.get_attribute("#chart", "data-version"))
    return version, page.locator("#chart .pct").all_inner_texts()


def wait_for_new_chart(page, after: int) -> None:
    page.wait_for_function(f"Number(document.getElementById('chart').dataset.version) > {after}")


def test_the_gpt_playground(gpt, page) -> None:
    page.goto(gpt.url + "/")
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector("#chart .bar-row")
    assert "GPT language model" in page.inner_text("#model-info")

    # Type a prompt: the chart follows the text.
    version, _ = chart(page)
    page.fill("#prompt", "")
    page.type("#prompt", "To be, or not", delay=20)
    wait_for_new_chart(page, version)
    page.wait_for_timeout(400)  # let the debounced fetch for the last keystroke land
    version, before = chart(page)
    assert len(before) == 15 and all(p.endswith("%") for p in before)
    api = gpt.client.post("/v1/next-token", json={"prompt": "To be, or not", "n": 15}).json()
    assert before == [f"{100 * t['prob']:.1f}%" for t in api["tokens"]]  # the bars are the API's (qkv next's) numbers
    assert page.locator("#chart .tok").all_inner_texts() == [t["label"] for t in api["tokens"]]

    # Move the temperature slider down with the keyboard: the distribution sharpens.
    page.focus("#temperature")
    for _ in range(14):
        page.keyboard.press("ArrowLeft")
    assert page.input_value("#temperature") == "0.3"
    wait_for_new_chart(page, version)
    page.wait_for_timeout(400)
    version, after = chart(page)
    assert after != before
    assert float(after[0].rstrip("%")) > float(before[0].rstrip("%"))  # T < 1: the likeliest token gains
    assert page.inner_text("#temperature-value") == "0.30"

    # Top-k 2: only two tokens keep any probability.
    page.focus("#top-k")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    wait_for_new_chart(page, version)
    page.wait_for_timeout(400)
    assert page.locator("#chart .bar-row:not(.removed)").count() == 2
    screenshot(page, "gpt-next-token")

    # Generate (greedy, so it runs to the token limit): tokens are appended while the stream runs.
    page.focus("#temperature")
    page.keyboard.press("Home")
    page.evaluate(
        """() => { window.tokenCounts = [];
        new MutationObserver(() => window.tokenCounts.push(document.querySelectorAll('#output .token').length))
          .observe(document.getElementById('output'), {childList: true}); }"""
    )
    page.fill("#max-tokens", "200")
    page.fill("#seed", "3")
    page.click("#generate")
    page.wait_for_selector("#output[data-state='done']")
    counts = page.evaluate("window.tokenCounts")
    grown = sorted({c for c in counts if c > 0})
    assert counts == sorted(counts) and len(grown) >= 2, counts  # the text grew in steps while the stream ran
    assert grown[-1] == page.locator("#output .token").count() == int(page.get_attribute("#output", "data-tokens"))
    output = page.inner_text("#output")
    assert output.startswith("To be, or not") and len(output) > len("To be, or not")
    assert "tokens in" in page.inner_text("#generate-status")
    screenshot(page, "gpt-generated")

    # The attention view: every layer and head of the current text.
    page.click("#show-attention")
    attention_shown(page)
    assert page.locator("#layer option").count() == gpt.bundle.config.n_layers
    assert page.locator("#head option").count() == gpt.bundle.config.n_heads + 1  # and the mean over heads
    page.select_option("#layer", "1")
    page.select_option("#head", "2")
    assert "causal self-attention" in page.inner_text("#attention-description")
    box = page.locator("#heatmap").bounding_box()
    assert box["width"] > 100 and box["height"] > 100
    page.locator("#heatmap").hover(position={"x": box["width"] - 10, "y": box["height"] - 10})  # the last cell
    assert "with weight" in page.inner_text("#attention-hover")
    screenshot(page, "gpt-attention")


def test_the_translator_playground(translator, page) -> None:
    page.goto(translator.url + "/")
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector("#chart .bar-row")
    assert page.inner_text("#prompt-label") == "Source sentence"
    assert page.is_visible("#target") and page.inner_text("#generate") == "Translate"
    page.fill("#prompt", "one two three")
    page.click("#generate")
    page.wait_for_selector("#output[data-state='done']")
    assert page.inner_text("#output").strip()
    page.click("#show-attention")
    attention_shown(page)
    kinds = page.locator("#attention-kind option").evaluate_all("options => options.map(o => o.value)")
    assert kinds == ["encoder", "decoder", "cross"]
    assert page.input_value("#attention-kind") == "cross"  # the alignment is shown first
    assert "cross-attention" in page.inner_text("#attention-description")
    screenshot(page, "translator-cross-attention")


def test_the_encoder_playground_shows_attention_only(encoder, page) -> None:
    page.goto(encoder.url + "/")
    page.wait_for_selector("body[data-ready='1']")
    assert not page.is_visible("#sampling-section") and not page.is_visible("#generate-section")
    page.click("#show-attention")
    attention_shown(page)
    assert "every token of the text" in page.inner_text("#attention-description")


def test_artifacts_folder_is_ignored_by_git() -> None:
    git = shutil.which("git")
    root = Path(__file__).resolve().parents[2]
    if git is None or not (root / ".gitignore").exists():
        pytest.skip("no git or no .gitignore here")
    assert "/test-artifacts/" in (root / ".gitignore").read_text()


def test_layers_and_heads_are_numbered_from_0(gpt, page) -> None:
    page.goto(gpt.url + "/")
    page.wait_for_selector("body[data-ready='1']")
    page.click("#show-attention")
    attention_shown(page)
    n_layers, n_heads = gpt.bundle.config.n_layers, gpt.bundle.config.n_heads
    layers = page.locator("#layer option").all_inner_texts()
    heads = page.locator("#head option").all_inner_texts()
    assert layers == [f"{i} (of 0–{n_layers - 1})" for i in range(n_layers)]
    assert heads[:-1] == [f"{i} (of 0–{n_heads - 1})" for i in range(n_heads)] and heads[-1] == "all heads (mean)"
    page.locator("#heatmap").hover(position={"x": 200, "y": 200})
    box = page.locator("#heatmap").bounding_box()
    page.locator("#heatmap").hover(position={"x": box["width"] - 10, "y": box["height"] - 10})  # the last cell
    last = len(page.evaluate("state.geometry.rows")) - 1
    assert f"(position {last})" in page.inner_text("#attention-hover")
    page.click("#show-walkthrough")
    page.wait_for_selector("#walkthrough-view[data-state='shown']")
    blocks = page.locator(".wt-block").evaluate_all("bs => bs.map(b => [b.id, b.querySelector('h3').textContent])")
    assert blocks == [[f"wt-block-{i}", f"Block {i}"] for i in range(n_layers)]
    options = page.locator("#wt-block-0 select.wt-head option").all_inner_texts()
    assert options == [f"head {h}" for h in range(n_heads)] + ["all heads (mean)"]


def test_the_translators_standalone_attention_page_opens_on_cross_attention(translator, page, tmp_path) -> None:
    from qkv.cli import main

    html = tmp_path / "attention.html"
    argv = ["attention", str(translator.bundle.path), "one two", "--out", str(tmp_path / "a.png"), "--html", str(html)]
    assert main(argv) == 0
    page.goto(html.as_uri())
    assert page.input_value("#group") == "cross"
    assert page.locator("#group option").count() == 3  # encoder and decoder self-attention are one pick away
