"""The walk-through in a real browser: the playground's panel, clicked cell by cell and compared with
/v1/walkthrough and /v1/next-token, and the standalone pages of `qkv lens --html` opened from disk (GPT-2's and
SmolLM2's 30 blocks). Skips as tests/server/browser_page.py says without Chromium or Playwright.
"""

from __future__ import annotations

import re

import pytest

from tests.pretrained.conftest import gpt2_dir  # noqa: F401  (session fixture)
from tests.server.browser_page import screenshot


def click_cell(page, canvas, i: int, j: int) -> None:
    """Click cell (row i, column j) of a walk-through heatmap, using the geometry the canvas keeps."""
    g = {k: float(v) for k, v in canvas.evaluate("c => ({...c.dataset})").items()}
    canvas.click(position={"x": g["labelW"] + g["cellW"] * (j + 0.5), "y": g["labelH"] + g["cellH"] * (i + 0.5)})


def test_the_walkthrough_in_the_playground(gpt, page, tmp_path) -> None:
    text = "To be, or not"
    page.goto(gpt.url + "/")
    page.wait_for_selector("body[data-ready='1']")
    page.fill("#prompt", text)
    page.click("#show-walkthrough")
    page.wait_for_selector("#walkthrough-view[data-state='shown']")
    page.wait_for_selector("#wt-final .bar-row")
    api = gpt.client.post("/v1/walkthrough", json={"text": text}).json()
    T = len(api["tokens"])
    chips = page.locator(".wt-chip").evaluate_all(
        "cs => cs.map(c => [c.children[0].textContent, c.children[1].textContent])"
    )
    assert chips == [[t, str(i)] for t, i in zip(api["tokens"], api["ids"], strict=True)]
    page.locator(".wt-chip").nth(2).click()
    assert f"has id {api['ids'][2]}" in page.inner_text("#wt-tokens .wt-detail")

    # Click an embedding cell: its token and position numbers and their sum.
    click_cell(page, page.locator("#wt-emb-sum"), 3, 5)
    e = api["embedding"]
    detail = page.inner_text("#wt-embedding .wt-detail")
    assert detail.startswith("position 3") and "dimension 5" in detail
    numbers = [float(x) for x in re.findall(r"-?\d+\.\d+(?:e[-+]?\d+)?", detail)]
    parts = [e["token"][3][5]] + ([] if e["position"] is None else [e["position"][3][5]]) + [e["sum"][3][5]]
    assert numbers == pytest.approx(parts, rel=1e-3, abs=1e-6)
    assert (e["position"] is None) == (gpt.bundle.config.positional in ("rope", "none"))

    # Block 1, head 2: the last token's weight on the first one, as the API (and `qkv attention`) has it.
    page.select_option("#wt-block-1 select.wt-head", "2")
    click_cell(page, page.locator("#wt-block-1 canvas.wt-attention-map"), T - 1, 0)
    detail = page.inner_text("#wt-block-1 .wt-detail")
    weight = api["blocks"][1]["attention"][2][T - 1][0]
    assert f"block 1, head 2: position {T - 1}" in detail and f"with weight {weight:.4f}" in detail
    page.locator("#wt-block-0 .wt-lens tr[data-position='1']").click()
    top = api["blocks"][0]["lens"][1]
    assert f"{top[0]['token']!r}"[1:-1] in page.inner_text("#wt-block-0 .wt-detail")
    page.locator("#wt-block-1 .wt-norm[data-position='0']").click()
    assert "after block 1 is" in page.inner_text("#wt-block-1 .wt-detail")

    # The last step follows its own temperature slider with the server's (qkv next's) numbers.
    version = int(page.get_attribute("#wt-final .wt-probs", "data-version"))
    page.focus("#wt-temperature")
    for _ in range(10):
        page.keyboard.press("ArrowLeft")
    assert page.input_value("#wt-temperature") == "0.5"
    page.wait_for_function(f"Number(document.querySelector('#wt-final .wt-probs').dataset.version) > {version}")
    page.wait_for_timeout(300)
    shown = page.locator("#wt-final .pct").all_inner_texts()
    expected = gpt.client.post("/v1/next-token", json={"prompt": text, "n": 15, "temperature": 0.5}).json()
    assert shown == [f"{100 * t['prob']:.1f}%" for t in expected["tokens"]]
    # A new text redraws every step and keeps the picked head and the slider settings.
    page.focus("#prompt")
    page.keyboard.press("End")
    page.keyboard.type("!")
    page.wait_for_function(f"document.querySelectorAll('.wt-chip').length === {T + 1}")
    assert page.input_value("#wt-block-1 select.wt-head") == "2" and page.input_value("#wt-temperature") == "0.5"
    path = tmp_path / "walkthrough.png"
    page.locator("#walkthrough-section").screenshot(path=str(path))
    assert path.stat().st_size > 10_000
    print(f"screenshot: {path}")


def test_the_standalone_walkthrough_page(gpt2_dir, page, tmp_path) -> None:  # noqa: F811
    import torch

    from qkv.cli import main
    from qkv.decoding.sampling import sampling_distribution

    out = tmp_path / "walk.html"
    assert main(["lens", "--model", str(gpt2_dir), "The quick brown fox", "--no-plot", "--html", str(out)]) == 0
    page.goto(out.as_uri())
    page.wait_for_selector("body[data-ready='1']")
    page.wait_for_selector("#wt-final .bar-row")
    assert page.locator(".wt-block").count() == 2
    # The page's copy of the sampling transform gives qkv's numbers on the page's own logits.
    logits = page.evaluate("DATA.logits")
    for temperature, top_k, top_p in [
        (1.0, None, None),
        (0.7, 5, None),
        (1.3, None, 0.6),
        (0.4, 20, 0.9),
        (0, None, None),
    ]:
        got = page.evaluate(
            "([t, k, p]) => QkvWalkthrough.samplingDistribution(DATA.logits, t, k, p)", [temperature, top_k, top_p]
        )
        want = sampling_distribution(torch.tensor(logits, dtype=torch.float64), temperature=temperature, top_k=top_k,
                                     top_p=top_p)  # fmt: skip
        assert len(got) == len(logits)
        torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), want, atol=1e-9, rtol=1e-7)
    version = int(page.get_attribute("#wt-final .wt-probs", "data-version"))
    page.focus("#wt-top-k")
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    page.wait_for_function(f"Number(document.querySelector('#wt-final .wt-probs').dataset.version) > {version + 2}")
    assert page.locator("#wt-final .bar-row:not(.removed)").count() == 3
    page.screenshot(path=str(tmp_path / "standalone-walkthrough.png"), full_page=True)


def test_a_30_block_walkthrough_shows_each_block_in_a_line_and_opens_it_on_a_click(smollm2, page, tmp_path) -> None:
    """SmolLM2's page (`qkv lens --html` on the GGUF file): the first two and last two blocks open, the others one
    line each with what the lens reads at the last position, drawn when opened."""
    from qkv.cli import main

    out = tmp_path / "walk.html"
    assert main(["lens", "--model", str(smollm2), "The capital of France is", "--no-plot", "--html", str(out)]) == 0
    page.goto(out.as_uri())
    page.wait_for_selector("body[data-ready='1']")
    blocks = page.locator(".wt-block")
    assert blocks.count() == 30
    opened = page.locator(".wt-block details[open]").evaluate_all("ds => ds.map(d => d.parentElement.dataset.layer)")
    assert opened == ["0", "1", "28", "29"]
    assert '" Paris" (' in page.inner_text("#wt-block-29 .wt-glance")
    assert page.locator("#wt-block-17 canvas").count() == 0  # not drawn until opened
    page.click("#wt-block-17 summary")
    page.wait_for_selector("#wt-block-17 canvas.wt-attention-map")
    page.select_option("#wt-block-17 select.wt-head", "3")
    screenshot(page, "walkthrough-smollm2")
