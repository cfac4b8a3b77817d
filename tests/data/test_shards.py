"""Token shards: written in order across files, read back through read-only memory maps as one sequence,
windows gathered across shard boundaries, and damaged folders caught with one clear sentence."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from qkv.data import shards as shards_module
from qkv.data.lm import TokenBatches
from qkv.data.shards import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_FILE,
    ShardWriter,
    TokenShards,
    is_prepared,
    read_manifest,
    token_dtype,
)
from qkv.errors import QkvError


def write_folder(folder: Path, ids: np.ndarray, *, vocab_size: int = 1000, shard_tokens: int = 7) -> TokenShards:
    """Shards of ``ids`` written in uneven pieces, with a minimal manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(folder, token_dtype(vocab_size), shard_tokens)
    for piece in np.array_split(ids, 5):
        writer.write(piece)
    shards = writer.close()
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tokens": int(len(ids)),
        "dtype": token_dtype(vocab_size).name,
        "shards": shards,
        "tokenizer": {"kind": "char", "requested_vocab_size": None},
    }
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    return TokenShards(folder)


def test_dtype_follows_the_vocabulary() -> None:
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32


def test_writer_rolls_over_and_the_maps_read_back_the_sequence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = np.arange(50) * 13 % 997
    shards = write_folder(tmp_path, ids)
    assert [s["tokens"] for s in shards.manifest["shards"]] == [7] * 7 + [1]
    assert sorted(p.name for p in tmp_path.glob("*.bin"))[0] == "shard-000000.bin"
    assert (tmp_path / "shard-000000.bin").stat().st_size == 7 * 2  # uint16: two bytes a token
    assert len(shards) == 50 and torch.equal(shards[0:50], torch.from_numpy(ids))
    assert torch.equal(shards[5:23], torch.from_numpy(ids[5:23])) and shards[10:10].numel() == 0
    starts = torch.tensor([0, 6, 13, 40, 49 - 9])  # windows inside one shard and across two or three
    for pread in (True, False):  # read from the files, or gathered from the maps
        monkeypatch.setattr(shards_module, "_PREAD", pread and hasattr(os, "preadv"))
        windows = shards.windows(starts, 10)
        assert windows.dtype == torch.int64
        assert torch.equal(windows, torch.from_numpy(np.stack([ids[s : s + 10] for s in starts.tolist()])))
        with pytest.raises(IndexError):
            shards.windows(torch.tensor([45]), 10)


def test_uint32_shards(tmp_path: Path) -> None:
    ids = np.array([0, 70_000, 123_456, 5])
    shards = write_folder(tmp_path, ids, vocab_size=200_000)
    assert shards.dtype == np.uint32 and shards[0:4].tolist() == ids.tolist()


def test_memory_maps_are_read_only(tmp_path: Path) -> None:
    shards = write_folder(tmp_path, np.arange(30))
    reopened = TokenShards(tmp_path)
    for array in reopened.arrays:
        assert not array.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1
    assert torch.equal(reopened[0:30], shards[0:30])


def mapped_kb(folder: Path) -> int:
    """Resident kB of this process's mappings of files in ``folder`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            inside = len(fields) >= 6 and fields[5].startswith(str(folder))
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file() or not shards_module._PREAD, reason="Linux's smaps")
def test_windows_map_no_pages_of_the_shards_into_the_process(tmp_path: Path) -> None:
    ids = np.arange(4_000_000) % 65_000  # 8 MB of uint16
    shards = write_folder(tmp_path, ids, vocab_size=65_536, shard_tokens=1_500_000)
    starts = torch.randint(len(ids) - 65, (2000,), generator=torch.Generator().manual_seed(0))
    windows = shards.windows(starts, 65)
    assert torch.equal(windows, torch.from_numpy(ids[starts[:, None].numpy() + np.arange(65)]))
    assert mapped_kb(tmp_path) == 0  # the file cache holds the pages, not this process
    shards[0:1_000_000]  # a range goes through the map  # noqa: B018
    assert mapped_kb(tmp_path) > 0  # (so the measurement above can see mapped pages)


def test_releasing_pages_keeps_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shards_module, "_PREAD", False)  # windows from the maps, as without os.preadv
    monkeypatch.setattr(shards_module, "RELEASE_WINDOWS", 3)
    ids = np.arange(200) % 251
    shards = write_folder(tmp_path, ids, shard_tokens=64)
    for start in range(0, 180, 7):
        window = shards.windows(torch.tensor([start]), 20)
        assert window[0].tolist() == ids[start : start + 20].tolist()


def test_token_batches_over_shards_equal_batches_over_a_tensor(tmp_path: Path) -> None:
    ids = torch.randint(0, 500, (3000,))
    shards = write_folder(tmp_path, ids.numpy(), shard_tokens=256)
    memory, mapped = (TokenBatches(data, context_length=16, seed=3) for data in (ids, shards))
    assert (mapped.n_train_tokens, mapped.n_val_tokens) == (memory.n_train_tokens, memory.n_val_tokens) == (2700, 300)
    for _ in range(5):
        assert all(torch.equal(a, b) for a, b in zip(memory.train_batch(8), mapped.train_batch(8), strict=True))
    for split in ("train", "val"):
        for a, b in zip(memory.eval_batches(split, 3, 8), mapped.eval_batches(split, 3, 8), strict=True):
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for rank in range(2):  # each process of two its own rows
        a = memory.train_batch(4, rank=rank, world_size=2)
        b = mapped.train_batch(4, rank=rank, world_size=2)
        assert torch.equal(a[0], b[0])
    assert torch.equal(mapped.val_ids, ids[2700:])
    mapped.load_state_dict(memory.state_dict())  # the same checkpoint state resumes either
    assert torch.equal(memory.train_batch(8)[0], mapped.train_batch(8)[0])


# ------------------------------------------------------------------------------------------- bad folders


def test_a_shard_whose_size_does_not_match_the_manifest(tmp_path: Path) -> None:
    write_folder(tmp_path, np.arange(30))
    with open(tmp_path / "shard-000001.bin", "ab") as f:
        f.write(b"\x00")
    with pytest.raises(QkvError, match=r"shard-000001.bin has 15 bytes but the manifest says 14 bytes \(7 uint16"):
        TokenShards(tmp_path)
    (tmp_path / "shard-000001.bin").unlink()
    with pytest.raises(QkvError, match=r"shard-000001.bin is missing but the manifest says 14 bytes"):
        TokenShards(tmp_path)


def test_verify_catches_changed_bytes(tmp_path: Path) -> None:
    write_folder(tmp_path, np.arange(30))
    TokenShards(tmp_path).verify()
    data = bytearray((tmp_path / "shard-000002.bin").read_bytes())
    data[3] ^= 0xFF
    (tmp_path / "shard-000002.bin").write_bytes(bytes(data))
    with pytest.raises(QkvError, match="shard-000002.bin does not match its sha256"):
        TokenShards(tmp_path).verify()


def test_damaged_or_foreign_manifests(tmp_path: Path) -> None:
    write_folder(tmp_path, np.arange(30))
    assert is_prepared(tmp_path) and not is_prepared(tmp_path / "nope") and not is_prepared(None)
    manifest = json.loads((tmp_path / MANIFEST_FILE).read_text())
    for change, message in [
        ({"tokens": 31}, "does not add up"),
        ({"format": "something-else"}, "is not a qkv prepared-data manifest"),
        ({"format_version": 99}, "prepare the data again with this qkv"),
    ]:
        (tmp_path / MANIFEST_FILE).write_text(json.dumps({**manifest, **change}))
        with pytest.raises(QkvError, match=message):
            read_manifest(tmp_path)
