"""The chat panel in a real browser: a tiny Llama with SmolLM2's chat template, served; answers streamed with the
whole history, a system prompt, /reset, a refused turn, and no panel for a model without a template. Skips as
tests/server/browser_page.py says without Chromium or Playwright.
"""

from __future__ import annotations

import pytest

from tests.server.browser_page import screenshot


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
