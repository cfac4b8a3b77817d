"""A conversation as the prompt a chat model continues: its text, its token ids, and the ids that end a turn.

    prompt = chat_prompt(bundle, [{"role": "user", "content": "What is attention?"}])
    prompt.text      "<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\nWhat is attention?<|im_end|>\\n"
                     "<|im_start|>assistant\\n"
    prompt.ids       [1, 9690, 198, ...]: the template's markers as one id each (<|im_start|> is 1), the same ids
                     as transformers' apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    prompt.stop_ids  (2,): generation of the assistant's turn stops at <|im_end|>

The markers the template writes are tokens the model was trained on, so the text is encoded with
``special=True`` (:meth:`qkv.tokenizers.Tokenizer.encode`); a special token's string typed in a message is
matched too, as transformers does: the template cannot tell it from its own.

Where a turn ends is read from the template itself: a probe conversation whose assistant message is a marker
is rendered, and the first special token written after the marker is the end of an assistant turn
(``<|im_end|>`` for ChatML, ``<|eot_id|>`` for Llama 3, ``<end_of_turn>`` for Gemma); with the tokenizer's eos,
these are the ids at which generation stops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qkv.chat_templates.messages import check_messages
from qkv.chat_templates.source import template_of
from qkv.chat_templates.template import ChatTemplate, names_read, plain_data, render
from qkv.errors import QkvError
from qkv.tokenizers import Tokenizer
from qkv.tokenizers.special import split_special

if TYPE_CHECKING:
    from qkv.model_dir import ModelBundle

PROBE = "qkv-chat-probe-7f3a"  # an assistant message no template changes and no tokenizer has a token for
PROBES = (
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": PROBE}],
    [{"role": "system", "content": "Hi"}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": PROBE}],
)


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered conversation: ``text``, its token ``ids``, and ``stop_ids``, the ids that end an assistant turn."""

    text: str
    ids: list[int]
    stop_ids: tuple[int, ...]


def chat_prompt(
    bundle: ModelBundle,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    template: ChatTemplate | str | None = None,
    **variables: Any,
) -> ChatPrompt:
    """The prompt for ``messages`` (OpenAI's format, see :mod:`qkv.chat_templates.messages`) under the bundle's chat
    template or ``template`` (:func:`qkv.chat_templates.source.template_of`).

    ``add_generation_prompt`` ends the text with the header of an assistant turn (the model writes the rest).
    ``variables`` go to the template as well, over the tokenizer's ``bos_token``, ``eos_token``, ...: ``tools``
    (a list of JSON schemas), ``documents`` (a list of objects), or any a template reads (``enable_thinking``).
    """
    chat = template_of(bundle, template)
    text = render_messages(bundle.tokenizer, chat, messages, add_generation_prompt=add_generation_prompt, **variables)
    ids = bundle.tokenizer.encode(text, special=True)
    return ChatPrompt(text=text, ids=ids, stop_ids=end_of_turn_ids(bundle, chat))


def render_messages(
    tokenizer: Tokenizer, template: ChatTemplate, messages: Any, *, add_generation_prompt: bool, **variables: Any
) -> str:
    """The checked ``messages`` rendered with ``template``, the tokenizer's special tokens and ``variables``; a
    ``tools`` or ``documents`` the template never reads is refused (the model would not see it)."""
    checked = template_variables(tokenizer, variables)
    unread = [name for name in ("tools", "documents") if variables.get(name) and name not in names_read(template)]
    if unread:
        raise QkvError(
            f"{template.source} never reads {unread[0]}, so the model would not see them: drop {unread[0]}, or give "
            "a chat template that shows them (--chat-template FILE)"
        )
    return render(template, check_messages(messages), add_generation_prompt=add_generation_prompt, variables=checked)


def template_variables(tokenizer: Tokenizer, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a template sees besides the messages: ``bos_token``, ``eos_token``, ``pad_token``, ``unk_token``
    (those the tokenizer has), then ``variables`` (checked ``tools`` and ``documents`` among them) over them."""
    out: dict[str, Any] = {f"{role}_token": token for role, token in tokenizer.special_tokens.items() if token}
    variables = dict(variables or {})
    for name, what in (("tools", "JSON schemas of functions"), ("documents", "objects such as {'title', 'text'}")):
        value = variables.get(name)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, dict) for v in value)):
            raise QkvError(f"{name} must be a list of {what}, got {type(value).__name__}: pass a list of dicts")
    out.update({name: plain_data(value) for name, value in variables.items()})
    return out


def end_of_turn_ids(bundle: ModelBundle, template: ChatTemplate | str | None = None) -> tuple[int, ...]:
    """The ids that end an assistant turn: the tokenizer's eos, and the special token the template writes right
    after an assistant message (read from a probe conversation, see the module docstring). Empty only for a
    tokenizer without eos whose template ends turns with ordinary text."""
    tokenizer, chat = bundle.tokenizer, template_of(bundle, template)
    ids = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
    variables = template_variables(tokenizer)
    for probe in PROBES:  # a template may insist on a system message
        try:
            text = render(chat, probe, add_generation_prompt=False, variables=variables)
        except QkvError:
            continue
        at = text.find(PROBE)
        if at < 0:
            continue
        after = text[at + len(PROBE) :]
        ids += [i for _, _, i in split_special(after, tokenizer.special_token_ids()) if i is not None][:1]
        break
    return tuple(dict.fromkeys(ids))
