"""Rendering chat templates: the same text as transformers' apply_chat_template(..., tokenize=False), on SmolLM2's
real template and on templates in the styles of other families; a failing template is one line naming its
source and the fix."""

from __future__ import annotations

import pytest

from qkv.chat_templates import ChatTemplate, chat_prompt, render
from qkv.errors import QkvError
from tests.chat_templates.templates import CHATML_GENERATION, STYLES

SYSTEM = {"role": "system", "content": "You are terse.  "}
TURNS = [
    {"role": "user", "content": "What is attention?"},
    {"role": "assistant", "content": " A weighted average of values. "},
    {"role": "user", "content": "Über Schlüssel und Werte? 🙂\nOne line."},
]
CONVERSATIONS = {"without system": TURNS, "with system": [SYSTEM, *TURNS], "one message": TURNS[:1]}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a café's city <today>",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_smollm2_renders_as_transformers(smol_bundle, smol_hf, conversation, add_generation_prompt) -> None:
    messages = CONVERSATIONS[conversation]
    want = smol_hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert chat_prompt(smol_bundle, messages, add_generation_prompt=add_generation_prompt).text == want
    assert want.startswith("<|im_start|>")  # the template itself, not a fallback


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("style", STYLES)
def test_styles_render_as_transformers(styled, style, conversation, add_generation_prompt) -> None:
    hf, bundle = styled(style)
    messages = CONVERSATIONS[conversation]
    if style == "mistral" and conversation == "with system":  # the template refuses: both say so
        with pytest.raises(Exception, match="Conversation roles must alternate"):
            hf.apply_chat_template(messages, tokenize=False)
        with pytest.raises(QkvError, match=r"refuses this conversation: Conversation roles must alternate .*: change"):
            chat_prompt(bundle, messages)
        return
    want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert chat_prompt(bundle, messages, add_generation_prompt=add_generation_prompt).text == want


@pytest.mark.parametrize("style", ["qwen2", "llama3"])
def test_tools_render_as_transformers(styled, style) -> None:
    hf, bundle = styled(style)
    messages = [*TURNS[:1], {"role": "user", "content": "Weather in Paris?"}]
    if style == "qwen2":
        call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        messages = [*TURNS[:1], {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": "22 °C"}, {"role": "tool", "content": "sunny"}]  # fmt: skip
    want = hf.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    got = chat_prompt(bundle, messages, tools=TOOLS).text
    assert got == want
    assert "café's city <today>" in got  # tojson writes JSON as it is, not escaped for HTML


def test_extra_variables_reach_the_template(styled) -> None:
    hf, bundle = styled("llama3")
    want = hf.apply_chat_template(TURNS, tokenize=False, add_generation_prompt=True, date_string="01 Jan 2025")
    got = chat_prompt(bundle, TURNS, date_string="01 Jan 2025").text
    assert got == want and "Today Date: 01 Jan 2025" in got


def test_text_parts_are_joined_with_newlines(smol_bundle) -> None:
    parts = [{"type": "text", "text": "Über"}, {"type": "text", "text": "alles"}]
    assert chat_prompt(smol_bundle, [{"role": "user", "content": parts}]) == chat_prompt(
        smol_bundle, [{"role": "user", "content": "Über\nalles"}]
    )


FEATURES = {  # one feature of transformers' Jinja environment each
    "tojson options": "{{ messages[0] | tojson(indent=2, sort_keys=True) }}"
    "{{ {'b': '<é>'} | tojson(separators=(',', ':')) }}",
    "dict and fromkeys": "{% set d = dict(a=1, **{'b': 2}) %}{{ d | tojson }}{{ dict.fromkeys(['x'], 0) | tojson }}",
    "namespace": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
    "loop controls": "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{{ m.role }}"
    "{% if loop.index0 == 2 %}{% break %}{% endif %}{% endfor %}",
    "trim and lstrip blocks": "  {% for m in messages %}\n    {{ m.role }}\n  {% endfor %}\n",
    "strftime_now": "{{ strftime_now('%Y') }}",
    "generation blocks": "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}|{% endfor %}",
    "keys and reasoning": "{% for m in messages %}{{ m.name is defined }} {{ m.thinking }} {{ m.reasoning_content }}"
    "{% if m.tool_calls is defined %}!{% endif %}{{ m | tojson }}{% endfor %}",
    "special tokens": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ unk_token }}|{{ sep_token }}|{{ tools }}",
}
REASONING = [
    {"role": "user", "content": "a", "name": "Ann", "tool_calls": None},
    {"role": "assistant", "content": "b", "reasoning": "because"},
    {"role": "user", "content": "c"},
]


@pytest.mark.parametrize("feature", FEATURES)
def test_environment_features_render_as_transformers(smol_bundle, smol_hf, feature) -> None:
    template = FEATURES[feature]
    want = smol_hf.apply_chat_template(REASONING, chat_template=template, tokenize=False)
    assert chat_prompt(smol_bundle, REASONING, template=template, add_generation_prompt=False).text == want


def test_generation_blocks_render_their_body(smol_bundle, smol_hf) -> None:
    want = smol_hf.apply_chat_template(TURNS, chat_template=CHATML_GENERATION, tokenize=False)
    assert chat_prompt(smol_bundle, TURNS, template=CHATML_GENERATION, add_generation_prompt=False).text == want


BROKEN = {  # template -> what the one line says
    "{% for m in messages %}{{ m.content }}": r"^the given chat template is not a valid Jinja template \(line 1: .*"
    r"\): fix it, or give another with --chat-template FILE$",
    "{{ raise_exception('Only user and assistant roles are supported!') }}": r"^the given chat template refuses this "
    r"conversation: Only user and assistant roles are supported!: change the messages as it says, or give another",
    "line one\n{{ nothing.here }}": r"failed at line 2 \(UndefinedError: 'nothing' is undefined\): fix the template",
    "{% for m in messages %}\n\n{{ m.content + 1 }}{% endfor %}": r"failed at line 3 \(TypeError: .*\): fix the",
    "{{ namespace(_hidden=1) }}": r"failed at line 1 \(SecurityError: .*_hidden.*\)",
    "{{ ''.__class__.__mro__ }}": r"failed at line 1 \(SecurityError: .*__class__.*\)",
}


@pytest.mark.parametrize("template", BROKEN)
def test_a_failing_template_is_one_line(smol_bundle, template) -> None:
    with pytest.raises(QkvError, match=BROKEN[template]) as error:
        chat_prompt(smol_bundle, TURNS, template=template)
    assert "\n" not in str(error.value)


def test_errors_name_the_templates_source(smol_bundle) -> None:
    with pytest.raises(QkvError, match=r"^chat template file x\.jinja refuses this conversation: no\b"):
        render(ChatTemplate("{{ raise_exception('no') }}", "chat template file x.jinja"), TURNS)
    with pytest.raises(QkvError, match=r"^the chat template of .*smollm2.* failed at line 1 \(ZeroDivisionError"):
        render(ChatTemplate("{{ 1 / 0 }}", f"the chat template of {smol_bundle.path}"), TURNS)
