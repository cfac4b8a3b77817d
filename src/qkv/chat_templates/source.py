"""Where a chat template comes from, in this order:

1. a file the user gives (``--chat-template FILE``): a Jinja file, or a JSON file holding one (a
   tokenizer_config.json or chat_template.json), read by :func:`read_template_file`;
2. the model's own (``bundle.chat_template``), which loading fills in: a Hugging Face folder's
   ``chat_template.jinja``, else its ``chat_template.json``, else the ``chat_template`` of its
   tokenizer_config.json (a string, or a list of named templates of which "default" is taken), as
   transformers reads them (:func:`hf_folder_template`); a qkv folder's ``chat_template.jinja``, which
   :func:`qkv.model_dir.save_model_dir` writes; a GGUF file's ``tokenizer.chat_template``;
3. otherwise none: one line saying so and how to give one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qkv.chat_templates.template import ChatTemplate, compile_template
from qkv.errors import QkvError
from qkv.io import read_json, read_text
from qkv.model_dir import CHAT_TEMPLATE_FILE

if TYPE_CHECKING:
    from qkv.model_dir import ModelBundle

GIVE_ONE = "give one with --chat-template FILE (a Jinja file such as a chat model's chat_template.jinja)"


def read_template_file(path: str | Path) -> ChatTemplate:
    """The chat template in ``path`` (checked to compile): a Jinja file, or a JSON file with a "chat_template"
    entry. A missing, unreadable, empty or invalid file is a QkvError."""
    path = Path(path)
    source = f"chat template file {path}"
    if path.suffix == ".json":
        text = _template_in_json(read_json(path, what="chat template file"), source)
        if text is None:
            raise QkvError(
                f"{source} has no 'chat_template' (nor one named 'default' in a list of them): give a file that "
                "has, such as the model's tokenizer_config.json, or a .jinja file"
            )
    else:
        text = read_text(path, what="chat template file")
    template = ChatTemplate(text, source)
    compile_template(template)
    return template


def hf_folder_template(folder: str | Path) -> str | None:
    """The chat template of a Hugging Face model folder (chat_template.jinja, chat_template.json,
    tokenizer_config.json, in that order), or None when it has none."""
    folder = Path(folder)
    jinja = folder / CHAT_TEMPLATE_FILE
    if jinja.is_file():
        return read_text(jinja, what="chat template")
    for name in ("chat_template.json", "tokenizer_config.json"):
        path = folder / name
        if path.is_file():
            text = _template_in_json(read_json(path, what=name), f"{name} in {folder}")
            if text is not None:
                return text
    return None


def _template_in_json(data: Any, source: str) -> str | None:
    """The "chat_template" of a JSON object: a string, or a list of {"name", "template"} (the "default" one)."""
    template = data.get("chat_template") if isinstance(data, dict) else None
    if template is None or (isinstance(template, str) and template.strip()):
        return template
    if isinstance(template, list) and all(isinstance(t, dict) for t in template):
        named = {t.get("name"): t.get("template") for t in template}
        default = named.get("default")
        return default if isinstance(default, str) and default.strip() else None  # transformers needs "default" too
    raise QkvError(f"{source} has a 'chat_template' of {json.dumps(template)[:40]}: it must be a non-empty string")


def template_of(bundle: ModelBundle, template: ChatTemplate | str | None = None) -> ChatTemplate:
    """The template to use: ``template`` (a :class:`ChatTemplate`, e.g. from :func:`read_template_file`, or a
    template's text), else the bundle's own, else a QkvError saying the model has none and how to give one."""
    if isinstance(template, ChatTemplate):
        return template
    if isinstance(template, str):
        if not template.strip():
            raise QkvError(f"the given chat template is empty: pass a template's text, or {GIVE_ONE}")
        return ChatTemplate(template, "the given chat template")
    if template is not None:
        raise QkvError(f"template must be a ChatTemplate or a template's text, got {type(template).__name__}")
    if not bundle.chat_template:
        raise QkvError(
            f"{bundle.path} has no chat template (a base model, or a folder without chat_template.jinja or "
            f"tokenizer_config.json's chat_template): {GIVE_ONE}"
        )
    return ChatTemplate(bundle.chat_template, f"the chat template of {bundle.path}")
