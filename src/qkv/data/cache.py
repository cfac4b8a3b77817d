"""The prepared cache: ``qkv train --data FILE`` tokenizes a corpus once; later runs, resumes and the other
processes of a torchrun job map the same shards.

The cache folder is ``$QKV_CACHE/prepared/NAME-KEY`` (``~/.cache/qkv/data/prepared/...`` by default). KEY
is a hash of the source's identity (its files' paths, sizes and modification times; the built-in corpus's
checksum) and of the tokenizer settings (kind, vocabulary size, sample size), so a changed file or another
tokenizer gets a folder of its own. Delete a folder to free its space: it is prepared again when needed.

Under torchrun the first process of each machine (LOCAL_RANK 0) prepares; the others wait for its manifest
to appear, then map the same files. (If that process fails, torchrun stops them all.)
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

from qkv.data.download import default_cache_dir
from qkv.data.prepare import SAMPLE_MB, prepare
from qkv.data.prepared_folder import PreparedData
from qkv.data.shards import FORMAT_VERSION, MANIFEST_FILE, is_prepared, read_manifest
from qkv.data.sources import DataArg, open_source
from qkv.tokenizers import Tokenizer

WAIT_SECONDS = 0.5
"""How often a waiting process looks for the manifest."""


def cache_root() -> Path:
    """``$QKV_CACHE/prepared``, or ``~/.cache/qkv/data/prepared``."""
    return default_cache_dir() / "prepared"


def prepared_for_training(
    data: DataArg,
    *,
    kind: str = "char",
    vocab_size: int | None = None,
    text_field: str = "text",
    sample_mb: float = SAMPLE_MB,
    tokenizer: Tokenizer | None = None,
    local_rank: int = 0,
    quiet: bool = False,
) -> PreparedData:
    """The prepared form of ``data``: the folder itself if ``data`` is one (written by ``qkv prepare``),
    else its folder in the cache, prepared first if it is not there yet.

    ``kind``, ``vocab_size`` and ``sample_mb`` say which tokenizer to train and key the cache. A resumed
    run passes its own ``tokenizer``: if the cache has lost the folder, the data is encoded with that
    tokenizer rather than a new one.
    """
    if is_prepared(data):
        folder = Path(data)
        return PreparedData(folder, read_manifest(folder), reused=True)
    source = open_source(data, text_field=text_field)
    settings = {"kind": kind, "vocab_size": vocab_size, "sample_mb": float(sample_mb)}
    key = json.dumps({"source": source.identity, "tokenizer": settings, "format": FORMAT_VERSION}, sort_keys=True)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", source.name)[:60] or "corpus"
    folder = cache_root() / f"{name}-{hashlib.sha256(key.encode('utf-8')).hexdigest()[:16]}"
    if not (folder / MANIFEST_FILE).is_file():
        if local_rank != 0:
            while not (folder / MANIFEST_FILE).is_file():
                time.sleep(WAIT_SECONDS)
        else:
            return prepare(
                source,
                folder,
                tokenizer=tokenizer or kind,
                vocab_size=None if tokenizer else vocab_size,
                sample_mb=sample_mb,
                quiet=quiet,
            )
    return PreparedData(folder, read_manifest(folder), reused=True)
