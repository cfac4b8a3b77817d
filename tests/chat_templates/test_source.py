"""Where a chat template comes from: a file the user gives, a Hugging Face folder (as transformers reads it), a qkv
folder's chat_template.jinja that survives saving and loading; and the lines saying what is wrong."""

from __future__ import annotations

import json

import pytest

import qkv
from qkv.chat_templates import chat_prompt, hf_folder_template, read_template_file
from qkv.errors import QkvError
from qkv.model_dir import CHAT_TEMPLATE_FILE, load_model_dir, save_model_dir
from qkv.models import GPTConfig
from qkv.models.family import build_model
from qkv.pretrained import save_as_qkv
from qkv.quantization.save import save_quantized
from qkv.tokenizers import CharTokenizer
from tests.chat_templates.test_template import TURNS

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def test_a_hugging_face_folder_brings_its_template(smol_bundle, smol_hf) -> None:
    assert smol_bundle.chat_template == smol_hf.chat_template
    assert "<|im_start|>" in smol_bundle.chat_template


def test_the_template_survives_saving_as_qkv(smol_bundle, tmp_path) -> None:
    save_as_qkv(smol_bundle, tmp_path / "run")
    assert (tmp_path / "run" / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8") == smol_bundle.chat_template
    reloaded = qkv.load(tmp_path / "run")
    assert reloaded.chat_template == smol_bundle.chat_template
    assert chat_prompt(reloaded, TURNS) == chat_prompt(smol_bundle, TURNS)


def test_the_template_survives_quantizing(smol_hf_dir, tmp_path) -> None:
    bundle = qkv.load(smol_hf_dir)  # quantizing changes the model in place: a bundle of its own
    save_quantized(bundle, tmp_path / "int8")
    assert qkv.load(tmp_path / "int8").chat_template == bundle.chat_template is not None


def tiny_run(tmp_path, chat_template=None):
    tokenizer = CharTokenizer.train("abc")
    model = build_model(GPTConfig(vocab_size=tokenizer.vocab_size, context_length=8, n_layers=1, d_model=8, n_heads=2))
    return save_model_dir(tmp_path, model, tokenizer, chat_template=chat_template), model, tokenizer


def test_a_qkv_folder_keeps_its_template_and_drops_a_stale_one(tmp_path) -> None:
    folder, model, tokenizer = tiny_run(tmp_path, chat_template=CHATML)
    assert load_model_dir(folder).chat_template == CHATML
    save_model_dir(folder, model, tokenizer)  # a model without a template: the old file would pair with it
    assert not (folder / CHAT_TEMPLATE_FILE).exists()
    assert load_model_dir(folder).chat_template is None
    (folder / CHAT_TEMPLATE_FILE).write_text(" \n", encoding="utf-8")
    with pytest.raises(QkvError, match=r"chat template .*chat_template\.jinja is empty"):
        load_model_dir(folder)


def test_hugging_face_files_in_transformers_order(tmp_path) -> None:
    assert hf_folder_template(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}), encoding="utf-8")
    assert hf_folder_template(tmp_path) is None
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}), encoding="utf-8")
    assert hf_folder_template(tmp_path) == "D"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named[:1]}), encoding="utf-8")
    assert hf_folder_template(tmp_path) is None  # no "default": transformers would not choose either
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "C"}), encoding="utf-8")
    assert hf_folder_template(tmp_path) == "C"
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "J"}), encoding="utf-8")
    assert hf_folder_template(tmp_path) == "J"
    (tmp_path / "chat_template.jinja").write_text("K", encoding="utf-8")
    assert hf_folder_template(tmp_path) == "K"
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": 3}), encoding="utf-8")
    with pytest.raises(QkvError, match=r"chat_template\.json in .* has a 'chat_template' of 3: it must be a non-empty"):
        hf_folder_template(tmp_path)


def test_reading_a_template_file(tmp_path) -> None:
    (tmp_path / "chat.jinja").write_text(CHATML, encoding="utf-8")
    template = read_template_file(tmp_path / "chat.jinja")
    assert template.text == CHATML and template.source == f"chat template file {tmp_path / 'chat.jinja'}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}), encoding="utf-8")
    assert read_template_file(tmp_path / "tokenizer_config.json").text == CHATML


BAD_FILES = {  # name, content -> the line
    ("missing.jinja", None): r"^chat template file .*missing\.jinja does not exist: check the path$",
    ("empty.jinja", "  \n"): r"^chat template file .*empty\.jinja is empty: give a file with text in it$",
    ("latin1.jinja", b"caf\xe9"): r"^chat template file .*latin1\.jinja is not valid UTF-8",
    ("broken.jinja", "{% if x %}\nno end"): r"^chat template file .*broken\.jinja is not a valid Jinja template "
    r"\(line 2: .*\): fix it, or give another with --chat-template FILE$",
    ("config.json", '{"bos_token": "<s>"}'): r"^chat template file .*config\.json has no 'chat_template'",
    ("bad.json", "{"): r"^chat template file .*bad\.json is not valid JSON",
}


@pytest.mark.parametrize(("name", "content"), BAD_FILES)
def test_bad_template_files_are_one_line(tmp_path, name, content) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(QkvError, match=BAD_FILES[name, content]) as error:
        read_template_file(path)
    assert "\n" not in str(error.value)


def test_a_folder_is_not_a_template_file(tmp_path) -> None:
    with pytest.raises(QkvError, match="is a directory: give a file"):
        read_template_file(tmp_path)
