"""What a new user trips on, through `qkv` itself: a resume that would drop --arch, --preset or --tokenizer; a RoPE
base that is not a positive number; a translator trained in bf16; files this user may not read; qkv chat's stdin;
notes instead of silence (a picture replaced, empty sentences, an empty text) and refusals instead of no effect."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qkv.cli import main
from qkv.loading import load
from qkv.quantization import Int4Linear, Int8Linear
from tests.cli.conftest import gpt_and_translator
from tests.cli.test_bad_input import GOOD_TEXT, refused, run_cli, train_args


@pytest.fixture
def run(tiny_run, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_run, tmp_path / "run"))


@pytest.mark.parametrize(
    ("flags", "kept"),
    [(["--arch", "llama"], "--arch llama (the run's: gpt)"), (["--preset", "gpt-micro"], "--preset gpt-micro (the "
     "run's: gpt-nano)"), (["--tokenizer", "word"], "--tokenizer word (the run's: char)"),
     (["--task", "translate"], "--task translate (the run's: lm)")],
)  # fmt: skip
def test_a_resume_keeps_what_chose_the_model_and_says_so(run, capsys, flags, kept) -> None:
    argv = ["train", "--resume", str(run), "--steps", "6", "--quiet", "--no-samples"]
    refused(capsys, [*argv, *flags], f"a resumed run keeps its model and tokenizer, so {kept} cannot change")
    assert run_cli(capsys, *argv, "--preset", "gpt-nano", "--arch", "gpt")[0] == 0  # the run's own: fine


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "rope_base=0.0 must be above 0"), ("-1", "rope_base=-1.0 must be above 0"),
     ("nan", "rope_base=nan must be a finite number"), ("inf", "rope_base=inf must be a finite number")],
)  # fmt: skip
def test_a_rope_base_that_is_no_positive_number_is_refused_before_the_run(tmp_path, capsys, value, message) -> None:
    data = tmp_path / "data.txt"
    data.write_text(GOOD_TEXT)
    args = [a for a in train_args(data, tmp_path / "run") if a not in ("--preset", "gpt-nano")]
    refused(capsys, [*args, "--arch", "llama", "--rope-base", value], message)
    assert not (tmp_path / "run").exists()  # nothing written: it was caught when the loss turned NaN, or saved inf
    refused(capsys, [*args, "--lr", "nan"], "setting lr = nan must be a finite number")


def test_a_translator_trains_and_validates_in_bf16(tmp_path, capsys) -> None:
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{a} {b}\t{b} {a}\n" for a in ("one", "two", "three") for b in ("x", "y", "z")) * 4)
    args = ["train", "--task", "translate", "--data", str(pairs), "--out", str(tmp_path / "run"), "--steps", "2",
            "--eval-interval", "2", "--eval-batches", "1", "--bleu-sentences", "2", "--eval-beam", "2",
            "--warmup-steps", "1", "--preset", "transformer-tiny", "--precision", "bf16", "--quiet",
            "--no-samples"]  # fmt: skip
    assert main(args) == 0  # index_copy_(): Float and BFloat16, at the first validation
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("bleu" in row for row in rows)


def without_root_reads() -> None:
    """In the child, before it runs qkv: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so that root obeys
    permission bits as their owner does (a chmod 000 file cannot be read)."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # out of the bounding set too: exec would give root them back
        libc.prctl(24, capability, 0, 0, 0)  # PR_CAPBSET_DROP
    header, data = Header(0x20080522, 0), (Data * 2)()
    libc.capget(ctypes.byref(header), data)
    data[0].effective &= ~0b110
    data[0].permitted &= ~0b110
    libc.capset(ctypes.byref(header), data)


def qkv_as_user(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, "-m", "qkv", *argv], capture_output=True, text=True, env=env,
                          preexec_fn=without_root_reads if os.geteuid() == 0 else None, timeout=300)  # fmt: skip


@pytest.mark.parametrize("locked", ["", "model.safetensors", "tokenizer.json", "checkpoints"])
def test_files_this_user_may_not_read_are_one_line(run, locked) -> None:
    target = run / locked if locked else run
    target.chmod(0)
    try:
        argv = ["train", "--resume", str(run), "--steps", "6"] if locked == "checkpoints" else ["generate", str(run)]
        done = qkv_as_user(*argv, "--quiet" if locked == "checkpoints" else "--max-new-tokens=2")
    finally:
        target.chmod(0o755)
    errors = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("note:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "(permission denied): give yourself read access" in errors[0] or "Permission denied" in errors[0]


def test_qkv_chat_says_what_its_stdin_held(tmp_path, capsys, monkeypatch) -> None:
    import io

    gpt, _ = gpt_and_translator(tmp_path)
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    chat = ["chat", str(gpt), "--chat-template", str(template), "--max-new-tokens", "2"]
    for stdin, note in [(b"", "standard input held no line to answer"), (b"\n \n", "held no line to answer"),
                        (b"/frobnicate\n", "/frobnicate is not a command"),
                        (b"caf\xe9\n", "is not UTF-8 (byte 0xe9)")]:  # fmt: skip
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
        code, err = run_cli(capsys, *chat)
        assert code == 0 and note in err, err
    refused(capsys, [*chat[:-1], "0"], "--max-new-tokens 0 leaves no room for an answer")


def test_notes_instead_of_silence(tmp_path, capsys) -> None:
    gpt, translator = gpt_and_translator(tmp_path)
    assert main(["attention", str(gpt), "the fox"]) == 0
    code, err = run_cli(capsys, "attention", str(gpt), "the fox")  # a second time: the picture is replaced
    assert code == 0 and f"replacing {gpt / 'attention.png'}" in err
    lines = tmp_path / "lines.txt"
    lines.write_text("the fox\n\nthe dog\n")
    code, err = run_cli(capsys, "translate", str(translator), "--file", str(lines), "--beam", "1")
    assert code == 0 and "1 of the 3 sentences are empty: each is translated as an empty line" in err
    assert "<unk>" not in err  # the line breaks between sentences are no characters the vocabulary lacks
    code, err = run_cli(capsys, "translate", str(translator), "", "--beam", "1", "--max-len-b", "1000")
    assert code == 0 and "1 of the 1 sentences are empty" in err  # an empty argument was dropped without a word
    assert "--max-len-b 1000 is past the model's 24 positions: each translation stops at 23 tokens" in err
    assert "the text is empty: this is the distribution of the first token" in run_cli(capsys, "next", str(gpt), "")[1]
    refused(capsys, ["explain", ""], "the text is empty: give some text, or leave it out for the worked example")


def test_options_that_would_have_no_effect_are_refused(tiny_run, tmp_path, capsys) -> None:
    w4a8 = ["quantize", str(tiny_run), "--out", str(tmp_path / "w4a8"), "--bits", "4", "--activations", "int8"]
    assert main(w4a8) == 0  # int4 layers round their inputs too (W4A8): no longer the unembedding's alone
    info = json.loads((tmp_path / "w4a8" / "quantization.json").read_text())
    assert info["activations"] == "int8" and "W4A8" in info["description"]
    layers = [m for m in load(tmp_path / "w4a8").model.modules() if isinstance(m, (Int4Linear, Int8Linear))]
    assert {type(m) for m in layers} == {Int4Linear, Int8Linear}
    assert {m.activations for m in layers} == {"int8", "int8x2"}  # W_2 and W_U twice (activation_modes)
    assert main(["quantize", str(tiny_run), "--out", str(tmp_path / "w8a8"), "--activations", "int8"]) == 0
    info = json.loads((tmp_path / "w8a8" / "quantization.json").read_text())
    assert info["activations"] == "int8" and "activations stay float" not in info["description"]
    assert "activations int8 too" in info["description"]
    capsys.readouterr()
    analogy = ["embeddings", str(tiny_run), "--analogy", "king", "man", "woman"]
    refused(capsys, analogy, "a character model's (it splits into ['<unk>', 'i', '<unk>', '<unk>']): give one")
    code, err = run_cli(capsys, "export", str(tiny_run), "--out", str(tmp_path / "m.txt"))
    assert "--out " in err and "--onnx" not in err  # the flag is --out (--onnx, its old name, still parses)


def test_the_model_help_names_every_format_qkv_opens() -> None:
    from qkv.cli.common import MODEL_HELP
    from qkv.models.gpt.gguf import ARCHITECTURES as GPT_GGUF
    from qkv.models.llama.gguf import ARCHITECTURES as LLAMA_GGUF

    assert all(arch in MODEL_HELP for arch in (*GPT_GGUF, *LLAMA_GGUF))
    assert all(name in MODEL_HELP for name in ("Llama", "Qwen2", "Mistral", "GPT-2", "BERT", "Marian", ".gguf"))
