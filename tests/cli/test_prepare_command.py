"""`qkv prepare` and `qkv train --data DIR` as a user types them: round trips on every input format, exact
resume from prepared data, and bad input as one line with exit code 2 that leaves nothing half-written."""

from __future__ import annotations

import errno
import gzip
import json
from pathlib import Path

import pytest

from qkv.cli import main
from qkv.data import cache as cache_module
from qkv.data import shards as shards_module
from qkv.data.shards import TokenShards
from qkv.tokenizers import load_tokenizer
from qkv.training import TrainConfig, train_language_model
from qkv.training.metrics import read_metrics
from tests.cli.test_bad_input import assert_one_line_error

zstandard = pytest.importorskip("zstandard")
TEXT = "".join(f"Line {i}: the cat sat on the mat, and the dog ran to the park.\n" for i in range(150))
TRAIN = ["--preset", "gpt-nano", "--steps", "4", "--warmup-steps", "1", "--eval-interval", "2", "--eval-batches", "1"]
TRAIN += ["--context-length", "32", "--quiet", "--no-samples"]


def formats(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    lines = TEXT.splitlines(keepends=True)
    docs = ["".join(lines[i : i + 30]) for i in range(0, len(lines), 30)]
    jsonl = "".join(json.dumps({"body": d}) + "\n" for d in docs).encode()
    paths = {"txt": root / "a.txt", "txt.gz": root / "a.txt.gz", "jsonl.zst": root / "a.jsonl.zst"}
    paths["txt"].write_text(TEXT, encoding="utf-8")
    paths["txt.gz"].write_bytes(gzip.compress(TEXT.encode()))
    paths["jsonl.zst"].write_bytes(zstandard.compress(jsonl))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        paths["parquet"] = root / "a.parquet"
        pq.write_table(pa.table({"body": docs}), paths["parquet"])
    except ImportError:
        pass
    try:
        import datasets

        paths["hf"] = root / "hf"
        datasets.Dataset.from_dict({"body": docs}).save_to_disk(str(paths["hf"]))
    except ImportError:
        pass
    return paths


def test_prepare_then_train_on_every_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, path in formats(tmp_path / "in").items():
        data = f"hf:{path}" if name == "hf" else str(path)
        out = tmp_path / f"prepared-{name}"
        field = [] if name.startswith("txt") else ["--text-field", "body"]
        args = ["prepare", data, "--out", str(out), "--tokenizer", "bpe", "--vocab-size", "300", "--quiet", *field]
        assert main(args) == 0, name
        report = capsys.readouterr().out
        assert f"train on it: qkv train --data {out}" in report and "bpe, " in report
        assert main(["train", "--data", str(out), "--out-dir", str(tmp_path / f"run-{name}"), *TRAIN]) == 0, name
        run = tmp_path / f"run-{name}"
        assert load_tokenizer(run / "tokenizer.json") == load_tokenizer(out / "tokenizer.json"), name
        saved = json.loads((run / "train_config.json").read_text())
        assert saved["train"]["tokenizer"] == "bpe" and saved["data"]["prepared"] == str(out)
        assert [r["step"] for r in read_metrics(run) if "val_loss" in r] == [2, 4], name
    same = ["--tokenizer", "bpe", "--vocab-size", "300"]
    again = main(["prepare", str(tmp_path / "in" / "a.txt"), "--out", str(tmp_path / "prepared-txt"), *same])
    assert again == 0 and "already prepared (reused)" in capsys.readouterr().out  # same command: nothing redone


def test_train_on_a_file_tokenizes_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "book.txt"
    path.write_text(TEXT, encoding="utf-8")
    assert main(["train", "--data", str(path), "--out-dir", str(tmp_path / "one"), *TRAIN]) == 0
    monkeypatch.setattr(cache_module, "prepare", lambda *a, **k: pytest.fail("tokenized again"))
    assert main(["train", "--data", str(path), "--out-dir", str(tmp_path / "two"), *TRAIN]) == 0
    assert main(["train", "--resume", str(tmp_path / "two"), "--steps", "6", "--quiet", "--no-samples"]) == 0


@pytest.mark.parametrize("data", ["prepared", "file"])
def test_resume_from_prepared_data_is_exact(tmp_path: Path, data: str) -> None:
    path = tmp_path / "book.txt"
    path.write_text(TEXT * 2, encoding="utf-8")
    if data == "prepared":
        assert main(["prepare", str(path), "--out", str(tmp_path / "prepared"), "--quiet"]) == 0
        path = tmp_path / "prepared"
    settings = dict(data=str(path), preset="gpt-nano", steps=10, warmup_steps=2, eval_interval=4, eval_batches=2)
    settings.update(log_interval=1, batch_size=4, model={"context_length": 32})
    whole = train_language_model(TrainConfig.create(**settings, out_dir=str(tmp_path / "whole")), quiet=True)

    def stop(trainer, step, loss) -> None:
        if step == 5:
            trainer.request_stop()

    config = TrainConfig.create(**settings, out_dir=str(tmp_path / "split"))
    assert train_language_model(config, quiet=True, on_step=stop).stopped == "interrupted"
    assert train_language_model(config, resume=config.out_dir, quiet=True).step == 10
    metrics = [{k: r[k] for k in ("step", "train_loss", "val_loss") if k in r} for r in read_metrics(whole.run_dir)]
    assert metrics == [
        {k: r[k] for k in ("step", "train_loss", "val_loss") if k in r} for r in read_metrics(config.out_dir)
    ]
    assert any("val_loss" in r for r in metrics)


# ------------------------------------------------------------------------------------------- bad input


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def nothing_left(root: Path, name: str) -> bool:
    return not (root / name).exists() and not list(root.glob(f".{name}.preparing-*"))


def test_bad_inputs_are_one_line_and_leave_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("\n")
    (tmp_path / "d.jsonl").write_text('{"text": "one"}\n{"body": "two"}\n')
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(TEXT.encode())[:-30])
    cases = [
        (str(tmp_path / "empty"), "holds no text (its 1 file is empty)"),
        (str(tmp_path / "none" / "*.txt"), "matches no files"),
        (str(tmp_path / "d.jsonl"), f"{tmp_path / 'd.jsonl'} line 2 has no 'text' field"),
        (str(tmp_path / "cut.txt.gz"), f"compressed file {tmp_path / 'cut.txt.gz'} is truncated"),
    ]
    for data, fragment in cases:
        code, err = run_cli(capsys, "prepare", data, "--out", str(tmp_path / "out"))
        assert_one_line_error(code, err, fragment)
        assert nothing_left(tmp_path, "out")
        code, err = run_cli(capsys, "train", "--data", data, "--out-dir", str(tmp_path / "run"), *TRAIN)
        assert_one_line_error(code, err, fragment)


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.txt").write_text(TEXT)

    def full(file, data) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shards_module, "write_bytes", full)
    code, err = run_cli(capsys, "prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "out"), "--quiet")
    assert_one_line_error(code, err, "the disk filled up while writing the prepared data")
    assert nothing_left(tmp_path, "out")


def test_damaged_and_mismatched_preparations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.txt").write_text(TEXT)
    out = str(tmp_path / "out")
    assert main(["prepare", str(tmp_path / "a.txt"), "--out", out, "--quiet"]) == 0
    capsys.readouterr()
    code, err = run_cli(capsys, "prepare", str(tmp_path / "a.txt"), "--out", out, "--tokenizer", "word")
    assert_one_line_error(code, err, "already holds a different preparation")
    code, err = run_cli(
        capsys, "train", "--data", out, "--tokenizer", "word", "--out-dir", str(tmp_path / "r1"), *TRAIN
    )
    assert_one_line_error(code, err, "was prepared with --tokenizer char, but this run asks for --tokenizer word")
    assert main(["train", "--data", out, "--out-dir", str(tmp_path / "run"), *TRAIN]) == 0
    other = str(tmp_path / "other")
    assert main(["prepare", str(tmp_path / "a.txt"), "--out", other, "--tokenizer", "word", "--quiet"]) == 0
    capsys.readouterr()
    code, err = run_cli(capsys, "train", "--resume", str(tmp_path / "run"), "--data", other, "--steps", "6")
    assert_one_line_error(code, err, "was encoded with another tokenizer than the run")
    shard = tmp_path / "out" / "shard-000000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    code, err = run_cli(capsys, "train", "--resume", str(tmp_path / "run"), "--steps", "6")
    assert_one_line_error(code, err, f"shard {shard} has")
    code, err = run_cli(capsys, "prepare", str(tmp_path / "a.txt"), "--out", out)
    assert_one_line_error(code, err, "the manifest says")
    with pytest.raises(Exception, match="the manifest says"):
        TokenShards(out)
