"""Prepared data, exports and Word2Vec as a user types them: sizes without a bound, damaged or swapped prepared
folders, an export over an existing file, leftovers of a killed preparation, a TOML value a flag replaces.
Each bad case is one line on stderr, exit code 2, no traceback, and nothing left behind."""

from __future__ import annotations

import gzip
import hashlib
import json
import socket
from pathlib import Path

import numpy as np
import pytest

from qkv.cli import main
from qkv.data.shards import MANIFEST_FILE, TOKENIZER_FILE
from qkv.tokenizers import train_tokenizer
from tests.cli.test_bad_input import GOOD_TEXT, assert_one_line_error, run_cli, train_args


def _left(root: Path, *keep: str) -> list[str]:
    """What the command left in ``root`` besides ``keep``: hidden work folders included."""
    return sorted(p.name for p in root.iterdir() if p.name not in keep)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "data.txt"
    path.write_text(GOOD_TEXT)
    return path


# ------------------------------------------------------------------------------------------ qkv prepare

# (extra prepare flags, a fragment of the one line they get)
PREPARE_FLAGS = [
    (["--tokenizer", "bpe", "--vocab-size", "1000000000"], "--vocab-size must be between 1 and 1,048,576"),
    (["--tokenizer", "word", "--vocab-size", "0"], "--vocab-size must be between 1 and 1,048,576"),
    (["--shard-tokens", "1"], "--shard-tokens must be at least 1,000,000"),
]


@pytest.mark.parametrize(("extra", "fragment"), PREPARE_FLAGS, ids=[" ".join(e) for e, _ in PREPARE_FLAGS])
def test_bad_prepare_sizes(tmp_path, corpus, capsys, extra, fragment) -> None:
    code, err = run_cli(capsys, "prepare", str(corpus), "--out", str(tmp_path / "out"), "--quiet", *extra)
    assert_one_line_error(code, err, fragment)
    assert _left(tmp_path, corpus.name) == []  # no out, no hidden .out.preparing-* folder


def test_a_compressed_file_that_is_not_utf8_gets_a_hint_that_works(tmp_path, capsys) -> None:
    data = tmp_path / "book.txt.gz"
    data.write_bytes(gzip.compress("caf\xe9 au lait\n".encode("latin-1") * 20))
    code, err = run_cli(capsys, "prepare", str(data), "--out", str(tmp_path / "out"), "--quiet")
    assert_one_line_error(code, err, "`zcat book.txt.gz | iconv -f latin1 -t utf-8 > book.txt`")
    assert _left(tmp_path, data.name) == []


def test_hugging_face_offline_fails_at_once_in_one_line(tmp_path, capsys, monkeypatch) -> None:
    pytest.importorskip("datasets")
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ALL_PROXY", raising=False)
    monkeypatch.delenv("all_proxy", raising=False)

    def no_network(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", no_network)
    code, err = run_cli(capsys, "prepare", "hf:nobody/no-such-set", "--out", str(tmp_path / "out"), "--quiet")
    assert_one_line_error(code, err, "cannot reach the Hugging Face Hub at huggingface.co (Name or service not known)")
    assert "Retrying" not in err and _left(tmp_path) == []


def test_a_killed_preparations_folder_is_removed_by_the_next_run(tmp_path, corpus, capsys) -> None:
    stale = tmp_path / ".out.preparing-4194305-0123abcd"  # above any pid_max: its process is gone
    (stale / "shard-000000.bin").parent.mkdir()
    (stale / "shard-000000.bin").write_bytes(b"\0" * 100)
    (stale / ".owner").write_text("4194305\n")  # not locked: nobody holds it
    assert main(["prepare", str(corpus), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert f"removed {stale}, left by a preparation that was killed" in capsys.readouterr().err
    assert _left(tmp_path, corpus.name) == ["out"]


def test_a_given_tokenizer_that_lacks_characters_says_so(tmp_path, corpus, capsys) -> None:
    tokenizer = tmp_path / "tokenizer.json"
    train_tokenizer("char", "hello world").save(tokenizer)
    args = ["prepare", str(corpus), "--out", str(tmp_path / "out"), "--tokenizer", str(tokenizer), "--quiet"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "tokens became <unk> (characters or words the char tokenizer does not know)" in err
    assert "Traceback" not in err


# ------------------------------------------------------------------------------ a damaged prepared folder


@pytest.fixture
def prepared(tmp_path, corpus, capsys) -> Path:
    folder = tmp_path / "prepared"
    assert main(["prepare", str(corpus), "--out", str(folder), "--quiet"]) == 0
    capsys.readouterr()
    return folder


def _swap_tokenizer(folder: Path) -> None:
    train_tokenizer("char", GOOD_TEXT + "XYZ").save(folder / TOKENIZER_FILE)  # a similar one, other ids


def _ids_past_the_vocabulary(folder: Path) -> None:
    """A shard (and its manifest entry, as a writer would make them) holding an id the tokenizer lacks."""
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    shard = manifest["shards"][0]
    ids = np.fromfile(folder / shard["file"], dtype=manifest["dtype"])
    ids[5] = manifest["tokenizer"]["vocab_size"] + 7
    ids.tofile(folder / shard["file"])
    shard["sha256"] = hashlib.sha256((folder / shard["file"]).read_bytes()).hexdigest()
    shard["max_id"] = int(ids.max())
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))


DAMAGE = [
    ("swapped tokenizer", _swap_tokenizer, "is not the tokenizer the shards were encoded with"),
    ("ids past the vocabulary", _ids_past_the_vocabulary, "beyond the tokenizer's"),
]  # fmt: skip


@pytest.mark.parametrize(("damage", "fragment"), [d[1:] for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_damaged_prepared_folders_train_on_nothing(tmp_path, corpus, prepared, capsys, damage, fragment) -> None:
    damage(prepared)
    run = tmp_path / "run"
    assert_one_line_error(*run_cli(capsys, *train_args(prepared, run)), fragment)
    assert not run.exists()  # refused before the run folder is made: the --out-dir stays free
    code, err = run_cli(capsys, "prepare", str(corpus), "--out", str(prepared), "--verify", "--quiet")
    assert_one_line_error(code, err, fragment)  # --verify does not say "checksums verified"


# ------------------------------------------------------------------------------------------- qkv export


def test_export_over_an_existing_file_is_refused_without_force(tiny_run, tmp_path, capsys) -> None:
    pytest.importorskip("onnxscript")
    target = tmp_path / "model.onnx"
    target.write_bytes(b"an earlier export")
    code, err = run_cli(capsys, "export", str(tiny_run), "--onnx", str(target))
    assert_one_line_error(code, err, "model.onnx already exists: add --force to replace it")
    assert target.read_bytes() == b"an earlier export" and _left(tmp_path) == ["model.onnx"]


# ------------------------------------------------------------------------------------------- Word2Vec

# (extra word2vec flags, a fragment of the one line they get)
WORD2VEC_FLAGS = [
    (["--negative", "100000000"], "--negative must be a whole number from 1 to 1,000"),
    (["--window", "1000000000"], "--window must be a whole number from 1 to 1,000"),
    (["--window", "1000", "--negative", "1000", "--batch-size", "100000000"], "more than a quarter of the"),
]


def _word2vec(corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--task", "word2vec", "--data", str(corpus), "--out-dir", str(out), "--min-count", "1",
            "--quiet", "--no-samples", *extra]  # fmt: skip


@pytest.mark.parametrize(("extra", "fragment"), WORD2VEC_FLAGS, ids=[" ".join(e) for e, _ in WORD2VEC_FLAGS])
def test_bad_word2vec_sizes(tmp_path, corpus, capsys, extra, fragment) -> None:
    assert_one_line_error(*run_cli(capsys, *_word2vec(corpus, tmp_path / "run", *extra)), fragment)
    assert not (tmp_path / "run").exists()


def test_word2vec_on_a_two_word_text(tmp_path, capsys) -> None:
    data = tmp_path / "two.txt"
    data.write_text("hello world\n")
    assert main(_word2vec(data, tmp_path / "run", "--steps", "3")) == 0
    assert "Traceback" not in capsys.readouterr().err and (tmp_path / "run" / "model.safetensors").is_file()


# ------------------------------------------------------------------------------------------- TOML


def test_a_toml_value_is_checked_when_a_flag_replaces_it(tmp_path, corpus, capsys) -> None:
    config = tmp_path / "settings.toml"
    config.write_text("steps = 1.5\n")
    code, err = run_cli(capsys, *train_args(corpus, tmp_path / "run"), "--config", str(config))  # has --steps 4
    assert_one_line_error(code, err, "setting steps = 1.5 must be a whole number")
    assert not (tmp_path / "run").exists()
