"""Rendering a chat template: a conversation written as the one text a chat model was trained to read.

A chat model reads a conversation as a single sequence in which markers (special tokens) open and close the
turns; its chat template, a Jinja program shipped with the model, writes that sequence. SmolLM2's writes
ChatML::

    [{"role": "user", "content": "Hi"}]  ─▶  <|im_start|>system\\nYou are a helpful AI assistant ...<|im_end|>\\n
                                             <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n

The text must be exactly the one transformers' ``apply_chat_template(..., tokenize=False)`` writes, since that
is the text the model's training conversations were written as. So templates run in the same Jinja sandbox
(``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension
and ``{% generation %}`` blocks) with the same additions (a ``tojson`` filter that writes JSON unescaped,
``raise_exception``, ``strftime_now``, a ``dict`` and a ``namespace`` that cannot reach Python's internals),
and get the same variables (``messages``, ``tools``, ``documents``, ``add_generation_prompt``, plus the
tokenizer's ``bos_token``, ``eos_token``, ... and any others the caller gives).

A template that fails (a syntax error, ``raise_exception("Conversation roles must alternate ...")``, an
operation on an undefined variable) is one :class:`~qkv.errors.QkvError` naming the template's source and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils

from qkv.errors import QkvError

OTHER_TEMPLATE = "give another with --chat-template FILE"


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and where it came from, which errors name."""

    text: str
    source: str  # "chat template file chat.jinja", "the chat template of models/smollm2", ...


class TemplateRefusal(jinja2.exceptions.TemplateError):
    """Raised by a template's ``raise_exception(message)``: the template refuses the conversation."""


# --------------------------------------------------------------------------------- what templates can call


def _raise_exception(message: str) -> None:
    raise TemplateRefusal(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """Plain ``json.dumps`` (Jinja's own tojson escapes <, >, & and ' for HTML, which a prompt must not)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    """Today's date or time in ``format`` (Llama 3.1's "Today Date: 26 Jul 2024")."""
    return datetime.now().strftime(format)


class _Dict:
    """``dict(...)`` and ``dict.fromkeys(...)`` for templates, without handing them the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a namespace cannot hold {name!r}: rename it without the leading _")


class _Namespace(jinja2.utils.Namespace):
    """Jinja's ``namespace()`` refusing names that start with "_", the way to Python's internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805  (Jinja's signature: namespace(self=...) works)
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


# --------------------------------------------------------------------------------- {% generation %} blocks


@dataclass
class _Tracker:
    """While a render is tracked: how many characters came out so far, and the (start, end) of each block."""

    length: int = 0
    spans: list[tuple[int, int]] = field(default_factory=list)


_TRACKER: ContextVar[_Tracker | None] = ContextVar("qkv_chat_generation_tracker", default=None)


class GenerationBlocks(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: the text the assistant writes, marked by templates made for
    training on assistant turns only (TRL); it renders its body, and a tracked render records where it went."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

    def _generation(self, caller: Any) -> str:
        text = caller()
        tracker = _TRACKER.get()
        if tracker is not None:  # everything before this block has been counted by render()
            tracker.spans.append((tracker.length, tracker.length + len(text)))
        return text


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlocks, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    env.globals.update(dict=_Dict(), namespace=_Namespace)
    return env


_ENVIRONMENT = _environment()


@lru_cache(maxsize=64)
def _compiled(text: str) -> jinja2.Template:
    return _ENVIRONMENT.from_string(text)


def names_read(template: ChatTemplate) -> frozenset[str]:
    """The variables ``template`` reads (``messages``, ``tools``, ``bos_token``, ...), from its syntax tree."""
    compile_template(template)  # a syntax error: its line
    return _names_read(template.text)


@lru_cache(maxsize=64)
def _names_read(text: str) -> frozenset[str]:
    return frozenset(jinja2.meta.find_undeclared_variables(_ENVIRONMENT.parse(text)))


# --------------------------------------------------------------------------------- rendering


def compile_template(template: ChatTemplate) -> jinja2.Template:
    """The compiled template (cached by its text); a syntax error is a QkvError naming the source and line."""
    try:
        return _compiled(template.text)
    except jinja2.TemplateSyntaxError as error:
        message = _one_line(error.message or str(error))
        raise QkvError(
            f"{template.source} is not a valid Jinja template (line {error.lineno}: {message}): "
            f"fix it, or {OTHER_TEMPLATE}"
        ) from None


def render(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = False,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """The text ``template`` writes for ``messages`` (already checked: :func:`~qkv.chat_templates.check_messages`).

    ``variables``: the others the template sees (``bos_token``, ``tools``, ...); ``tools`` and ``documents``
    are None unless given, as in transformers. The caller makes them plain data (:func:`plain_data`).
    """
    return _render(template, messages, add_generation_prompt, variables or {}, None)


def render_with_generation_spans(
    template: ChatTemplate, messages: list[dict[str, Any]], *, variables: Mapping[str, Any] | None = None
) -> tuple[str, list[tuple[int, int]]]:
    """:func:`render` without a generation prompt, and the (start, end) characters of each ``{% generation %}``
    block in the text (none when the template has no such blocks)."""
    tracker = _Tracker()
    text = _render(template, messages, False, variables or {}, tracker)
    return text, tracker.spans


def _render(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    variables: Mapping[str, Any],
    tracker: _Tracker | None,
) -> str:
    compiled = compile_template(template)
    context = {"tools": None, "documents": None, **variables}
    context.update(messages=messages, add_generation_prompt=add_generation_prompt)
    token = _TRACKER.set(tracker)
    try:
        if tracker is None:
            return compiled.render(**context)
        chunks = []
        for chunk in compiled.generate(**context):  # lazily: a block sees the length of all the text before it
            chunks.append(chunk)
            tracker.length += len(chunk)
        return "".join(chunks)
    except TemplateRefusal as error:
        raise QkvError(
            f"{template.source} refuses this conversation: {_one_line(error.message or '')}: change the messages "
            f"as it says, or {OTHER_TEMPLATE}"
        ) from None
    except Exception as error:  # UndefinedError, SecurityError, TypeError of "a" + 1, ...
        line = _template_line(error)
        where = f" at line {line}" if line is not None else ""
        raise QkvError(
            f"{template.source} failed{where} ({type(error).__name__}: {_one_line(str(error))}): fix the template, "
            f"or {OTHER_TEMPLATE}"
        ) from None
    finally:
        _TRACKER.reset(token)


def _template_line(error: BaseException) -> int | None:
    """The template's line where ``error`` happened: Jinja puts the template's frames into the traceback."""
    line, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _one_line(text: str) -> str:
    return " ".join(text.split())


_PLAIN_TYPES: tuple[tuple[type, Callable[[Any], Any]], ...] = (
    (str, str.__str__),
    (int, int.__int__),
    (float, float.__float__),
)  # each JSON scalar type, and what turns a subclass of it into the plain type


def plain_data(value: Any) -> Any:
    """``value`` rebuilt from JSON's types (str, int, float, bool, None, lists, tuples, dicts), anything else
    replaced by a "<TypeName>" placeholder: objects with methods never reach the sandbox (as in transformers)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for base, plain in _PLAIN_TYPES:
        if isinstance(value, base):  # subclasses (enums, ...) lose their extra methods
            return plain(value)
    if isinstance(value, Mapping):
        return {plain_data(key): plain_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain_data(item) for item in value)
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):  # numpy and torch scalars
        return plain_data(value.item())
    return f"<{type(value).__name__}>"
