"""fetch(): checksum-verified downloads into a cache. Every "download" here is a local file:// URL."""

from __future__ import annotations

import hashlib
import re
import urllib.error
from pathlib import Path

import pytest

from qkv.data import KNOWN_CORPORA, Source, default_cache_dir, fetch
from qkv.data import download as download_module
from qkv.errors import QkvError
from tests.conftest import shared_corpus

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 50


@pytest.fixture()
def served(tmp_path: Path) -> Source:
    """A corpus "on a server": a temp file behind a file:// URL, with its true checksum."""
    origin = tmp_path / "server" / "input.txt"
    origin.parent.mkdir()
    origin.write_text(TEXT, encoding="utf-8")
    data = origin.read_bytes()
    return Source(url=origin.as_uri(), sha256=hashlib.sha256(data).hexdigest(), filename="tiny.txt", size=len(data))


def test_fetch_downloads_verifies_and_caches(served: Source, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = fetch(served, cache_dir=cache)
    assert path == cache / "tiny.txt"
    assert path.read_text(encoding="utf-8") == TEXT
    assert sorted(p.name for p in cache.iterdir()) == ["tiny.txt"]  # no temp file left behind


def test_cached_file_is_reused_without_downloading(served: Source, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = fetch(served, cache_dir=cache)
    (tmp_path / "server" / "input.txt").unlink()  # the "server" is gone: only the cache can answer
    assert fetch(served, cache_dir=cache) == first
    assert first.read_text(encoding="utf-8") == TEXT


def test_wrong_checksum_is_an_error_and_nothing_is_cached(served: Source, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    wrong = Source(url=served.url, sha256="0" * 64, filename="tiny.txt")
    with pytest.raises(QkvError, match="has sha256 .* not the expected 0{64}, so it was not cached"):
        fetch(wrong, cache_dir=cache)
    assert list(cache.iterdir()) == []


def test_a_stale_cached_file_is_replaced(served: Source, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "tiny.txt").write_text("half a download", encoding="utf-8")
    assert fetch(served, cache_dir=cache).read_text(encoding="utf-8") == TEXT


def test_unreachable_url_explains_how_to_supply_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "input.txt"
    source = Source(url=missing.as_uri(), sha256="0" * 64, filename="gone.txt")
    cache = tmp_path / "cache"
    with pytest.raises(QkvError) as caught:
        fetch(source, cache_dir=cache)
    message = str(caught.value)
    assert message.startswith(f"could not download gone from {source.url} (")
    assert message.endswith(f"download it yourself and pass --data /path/to/file, or put it at {cache / 'gone.txt'}")
    assert not (cache / "gone.txt").exists()


def test_unreachable_url_mentions_a_wrong_file_already_in_the_cache(tmp_path: Path) -> None:
    source = Source(url=(tmp_path / "missing.txt").as_uri(), sha256="0" * 64, filename="gone.txt")
    (tmp_path / "gone.txt").write_text("not it", encoding="utf-8")
    with pytest.raises(QkvError, match=r"the file already at .*gone\.txt has sha256 [0-9a-f]{64}, not 0{64}"):
        fetch(source, cache_dir=tmp_path)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (urllib.error.URLError(OSError(-3, "Temporary failure in name resolution")), "name resolution"),
        (urllib.error.HTTPError("http://x", 404, "Not Found", {}, None), "HTTP 404 Not Found"),  # type: ignore[arg-type]
        (TimeoutError("timed out"), "timed out"),
    ],
)
def test_network_failures_name_the_reason(
    error: Exception, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(download_module.urllib.request, "urlopen", fail)
    url = KNOWN_CORPORA["tinyshakespeare"].url
    with pytest.raises(QkvError, match=f"could not download tinyshakespeare from {re.escape(url)} \\(.*{reason}"):
        fetch("tinyshakespeare", cache_dir=tmp_path)


def test_known_name_uses_the_qkv_cache_variable(
    served: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(KNOWN_CORPORA, "tinyshakespeare", served)
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "env-cache"))
    assert fetch("tinyshakespeare") == tmp_path / "env-cache" / "tiny.txt"


def test_default_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QKV_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "qkv" / "data"
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "elsewhere"))
    assert default_cache_dir() == tmp_path / "elsewhere"


def test_unknown_name() -> None:
    with pytest.raises(QkvError, match="no known corpus called 'wikipedia': choose one of tinyshakespeare"):
        fetch("wikipedia")


def test_big_downloads_show_progress(
    served: Source, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(download_module, "PROGRESS_MIN_BYTES", 100)
    fetch(served, cache_dir=tmp_path / "cache")
    assert "downloading tiny:" in capsys.readouterr().err


def test_known_tinyshakespeare_checksum_matches_the_shared_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = shared_corpus("tinyshakespeare") / "input.txt"
    known = KNOWN_CORPORA["tinyshakespeare"]
    assert local.stat().st_size == known.size
    monkeypatch.setitem(
        KNOWN_CORPORA, "tinyshakespeare", Source(local.as_uri(), known.sha256, known.filename, known.size)
    )
    path = fetch("tinyshakespeare", cache_dir=tmp_path)
    assert path.read_bytes() == local.read_bytes()
