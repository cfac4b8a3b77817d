"""A conversation as ids: transformers' apply_chat_template(tokenize=True) ids, the template's markers one token
each while typed prompts keep them as text, and the ids that end an assistant turn."""

from __future__ import annotations

import pytest

from qkv.chat_templates import ChatPrompt, chat_prompt, end_of_turn_ids, read_template_file
from qkv.errors import QkvError
from qkv.model_dir import ModelBundle
from tests.chat_templates.templates import STYLES
from tests.chat_templates.test_template import CONVERSATIONS, SYSTEM, TURNS


def hf_ids(hf, messages, add_generation_prompt: bool, **kw) -> list[int]:
    return hf.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False, **kw
    )


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_smollm2_ids_are_transformers_ids(smol_bundle, smol_hf, conversation, add_generation_prompt) -> None:
    messages = CONVERSATIONS[conversation]
    prompt = chat_prompt(smol_bundle, messages, add_generation_prompt=add_generation_prompt)
    assert prompt.ids == hf_ids(smol_hf, messages, add_generation_prompt)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("style", STYLES)
def test_style_ids_are_transformers_ids(styled, style, add_generation_prompt) -> None:
    hf, bundle = styled(style)
    messages = TURNS if style == "mistral" else [SYSTEM, *TURNS]
    prompt = chat_prompt(bundle, messages, add_generation_prompt=add_generation_prompt)
    assert prompt.ids == hf_ids(hf, messages, add_generation_prompt)
    for token in STYLES[style][1]:  # the style's markers: one id each, as many as the text has
        assert prompt.ids.count(bundle.tokenizer.token_to_id(token)) == prompt.text.count(token)


def test_markers_are_single_tokens_in_a_chat_and_text_in_a_prompt(smol_bundle) -> None:
    tokenizer = smol_bundle.tokenizer
    start, end = tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<|im_end|>")
    prompt = chat_prompt(smol_bundle, TURNS)
    assert prompt.ids[0] == start
    assert prompt.ids.count(start) == prompt.text.count("<|im_start|>") == 5  # default system, 3 turns, the header
    assert prompt.ids.count(end) == prompt.text.count("<|im_end|>") == 4
    typed = tokenizer.encode("<|im_start|>user")  # a prompt typed by a user: the marker stays text, as before
    assert start not in typed and len(typed) > 2
    assert tokenizer.decode(typed) == "<|im_start|>user"
    assert tokenizer.encode("<|im_start|>user", special=True) == [start, tokenizer.token_to_id("user")]


def test_markers_typed_in_a_message_are_matched_as_transformers_does(smol_bundle, smol_hf) -> None:
    messages = [{"role": "user", "content": "say <|im_end|> please"}]
    assert chat_prompt(smol_bundle, messages).ids == hf_ids(smol_hf, messages, True)


def test_smollm2_turns_end_at_im_end(smol_bundle) -> None:
    im_end = smol_bundle.tokenizer.token_to_id("<|im_end|>")
    assert chat_prompt(smol_bundle, TURNS).stop_ids == (im_end,) == end_of_turn_ids(smol_bundle)
    assert smol_bundle.tokenizer.eos_id == im_end  # SmolLM2's eos is its end of turn


@pytest.mark.parametrize("style", STYLES)
def test_end_of_turn_ids_are_read_from_the_template(styled, style) -> None:
    _, bundle = styled(style)
    end_of_turn, eos = STYLES[style][4], STYLES[style][3] or "<|im_end|>"
    want = tuple(dict.fromkeys(bundle.tokenizer.token_to_id(t) for t in (eos, end_of_turn)))
    assert end_of_turn_ids(bundle) == want


def test_end_of_turn_falls_back_to_eos_when_the_template_writes_no_special_token(smol_bundle) -> None:
    plain = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n\n{% endfor %}"
    assert end_of_turn_ids(smol_bundle, plain) == (smol_bundle.tokenizer.eos_id,)


def test_template_from_a_file_or_text(smol_bundle, tmp_path) -> None:
    path = tmp_path / "plain.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}<|im_end|>{% endfor %}", encoding="utf-8")
    prompt = chat_prompt(smol_bundle, TURNS[:1], template=read_template_file(path))
    assert prompt == chat_prompt(smol_bundle, TURNS[:1], template=path.read_text(encoding="utf-8"))
    assert isinstance(prompt, ChatPrompt) and prompt.text == "[user] What is attention?<|im_end|>"
    assert prompt.ids[-1] == smol_bundle.tokenizer.token_to_id("<|im_end|>")


def test_a_model_without_a_template_says_how_to_give_one(smol_bundle) -> None:
    bare = ModelBundle(smol_bundle.model, smol_bundle.config, smol_bundle.tokenizer, None, smol_bundle.path)
    with pytest.raises(QkvError, match=r"has no chat template .*: give one with --chat-template FILE"):
        chat_prompt(bare, TURNS)
    with pytest.raises(QkvError, match="the given chat template is empty"):
        chat_prompt(smol_bundle, TURNS, template="  \n")


@pytest.mark.parametrize(("name", "value"), [("tools", {"name": "f"}), ("tools", ["f"]), ("documents", "text")])
def test_tools_and_documents_must_be_lists_of_objects(smol_bundle, name, value) -> None:
    with pytest.raises(QkvError, match=f"^{name} must be a list of .*: pass a list of dicts$"):
        chat_prompt(smol_bundle, TURNS, **{name: value})
