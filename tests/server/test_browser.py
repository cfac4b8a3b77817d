"""The playground in a real browser: headless Chromium (Debian's ``chromium`` package) driven by Playwright.

It loads the page, types a prompt, moves the temperature slider and sees the chart change, generates and sees
tokens arrive, opens the attention view, and does the same for a translator. Screenshots are saved to
test-artifacts/server/ at the top of the checkout. Without /usr/bin/chromium or the playwright package the
tests skip and say so (.ci/run installs both).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.pretrained.conftest import gpt2_dir  # noqa: F401  (session fixture)

CHROMIUM = Path(os.environ.get("QKV_CHROMIUM", "/usr/bin/chromium"))  # another build: set QKV_CHROMIUM
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "server"

if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} is absent: install Debian's chromium and chromium-driver packages "
        "(apt-get install chromium chromium-driver; .ci/run does) to run the browser tests",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is absent: pip install playwright (the test extra)"
)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1100, "height": 1400})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.set_default_timeout(30_000)
    yield page
    page.close()
    assert not errors, errors  # the page ran without a JavaScript error


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


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


def click_cell(page, canvas, i: int, j: int) -> None:
    """Click cell (row i, column j) of a walk-through heatmap, using the geometry the canvas keeps."""
    g = {k: float(v) for k, v in canvas.evaluate("c => ({...c.dataset})").items()}
    canvas.click(position={"x": g["labelW"] + g["cellW"] * (j + 0.5), "y": g["labelH"] + g["cellH"] * (i + 0.5)})


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


def test_the_translators_standalone_attention_page_opens_on_cross_attention(translator, page, tmp_path) -> None:
    from qkv.cli import main

    html = tmp_path / "attention.html"
    argv = ["attention", str(translator.bundle.path), "one two", "--out", str(tmp_path / "a.png"), "--html", str(html)]
    assert main(argv) == 0
    page.goto(html.as_uri())
    assert page.input_value("#group") == "cross"
    assert page.locator("#group option").count() == 3  # encoder and decoder self-attention are one pick away


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


@pytest.fixture(scope="module")
def chat_model(smol_hf_dir):
    """A tiny random Llama with SmolLM2's tokenizer and chat template, served."""
    from qkv.server import Limits
    from tests.server.conftest import serve

    yield from serve(str(smol_hf_dir), Limits(max_prompt_tokens=400, max_tokens=40, queue_timeout=30))


def chat_turn(page, text: str) -> str:
    """Type ``text`` into the chat box, send it and wait for the answer to end; the answer's text."""
    turns = int(page.get_attribute("#chat-log", "data-turns"))
    page.fill("#chat-input", text)
    page.press("#chat-input", "Enter")
    page.wait_for_function(
        f"document.getElementById('chat-log').dataset.turns === '{turns + 2}'"
        " && document.getElementById('chat-log').dataset.state === 'idle'"
    )
    return page.locator("#chat-log .chat-turn.assistant .chat-text").last.inner_text()


def test_the_chat_panel_streams_answers_with_the_history_a_system_prompt_and_reset(chat_model, page) -> None:
    import qkv

    page.goto(chat_model.url + "/")
    page.wait_for_selector("body[data-ready='1']")
    assert chat_model.client.get("/v1/model").json()["chat_template"] is True
    assert page.is_visible("#chat-section")  # /v1/chat/completions is served and the model has a template
    page.fill("#chat-system", "Be brief.")
    page.fill("#chat-max-tokens", "12")
    page.fill("#chat-temperature", "0")  # greedy: the answers are qkv.chat's
    page.dispatch_event("#chat-temperature", "input")
    assert page.inner_text("#chat-temperature-value") == "0 (greedy)"
    said = [{"role": "system", "content": "Be brief."}]
    for question in ["What is the capital of France?", "And of Italy?"]:
        answer = chat_turn(page, question)
        said.append({"role": "user", "content": question})
        expected = qkv.chat(chat_model.bundle, said, max_new_tokens=12, temperature=0)
        assert answer == expected.text and answer  # the whole conversation was sent: the answer to all of it
        said.append({"role": "assistant", "content": answer})
        assert "tokens in" in page.inner_text("#chat-status")
    assert page.locator("#chat-log .chat-turn").count() == 4
    screenshot(page, "chat")
    page.fill("#chat-input", "/reset")
    page.press("#chat-input", "Enter")
    assert page.locator("#chat-log .chat-turn").count() == 0 and "forgotten" in page.inner_text("#chat-status")
    answer = chat_turn(page, "Hello!")
    fresh = [said[0], {"role": "user", "content": "Hello!"}]
    assert answer == qkv.chat(chat_model.bundle, fresh, max_new_tokens=12, temperature=0).text
    page.fill("#chat-max-tokens", "100000")  # above the server's --max-tokens (40): said, and nothing sent
    page.fill("#chat-input", "One more?")
    page.press("#chat-input", "Enter")
    assert "from 1 to 40" in page.inner_text("#chat-status") and page.input_value("#chat-input") == "One more?"
    assert page.locator("#chat-log .chat-turn").count() == 2


def test_a_refused_turn_says_why_and_leaves_the_history(chat_model, browser) -> None:
    page = browser.new_page()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(chat_model.url + "/")
    page.wait_for_selector("body[data-ready='1']")
    page.fill("#chat-max-tokens", "4")
    chat_turn(page, "word " * 500)  # more than the server's --max-prompt-tokens (400): 413
    last = page.locator("#chat-log .chat-turn.assistant").last
    assert last.get_attribute("data-state") == "error" and "400" in last.inner_text()
    assert "not part of the conversation" in page.inner_text("#chat-status")
    assert len(errors) == 1 and "status of 413" in errors[0]  # the refused request, and no script error
    assert chat_turn(page, "Hi") and page.evaluate("chat.messages.length") == 2  # the refused turn is not in it
    page.close()


def test_a_model_without_a_chat_template_has_no_chat_panel(gpt, page) -> None:
    page.goto(gpt.url + "/")
    page.wait_for_selector("body[data-ready='1']")
    assert gpt.client.get("/v1/model").json()["chat_template"] is False
    assert not page.is_visible("#chat-section")
