"""Hugging Face ``datasets`` as a text source: ``hf:NAME[:CONFIG][@SPLIT]`` (streamed from the Hub, so a
corpus larger than the disk works too) or ``hf:FOLDER`` (a folder written by ``save_to_disk``, or a folder
of data files that ``load_dataset`` reads). Each example is one document: the string under the text field.

Needs the optional ``datasets`` package (``pip install 'qkv[data]'``). Offline, or with a name the Hub
does not know, opening the dataset is a QkvError that says so and how to use a local copy instead. Whether
the Hub can be reached is tried first, once, with a short timeout: offline, the library itself would retry
for half a minute with a warning each time.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from qkv.data.readers import DATA_EXTRA, Document, document_text
from qkv.errors import QkvError

PREFIX = "hf:"
PROBE_SECONDS = 5.0
"""How long the check that the Hub can be reached waits for a connection."""


@dataclass(frozen=True)
class DatasetSpec:
    """What ``hf:NAME[:CONFIG][@SPLIT]`` names; ``split`` defaults to "train"."""

    name: str
    config: str | None = None
    split: str = "train"

    @classmethod
    def parse(cls, text: str) -> DatasetSpec:
        rest = text.removeprefix(PREFIX)
        rest, _, split = rest.partition("@")
        name, _, config = rest.partition(":")
        if not name:
            raise QkvError(f"{text!r} names no dataset: write hf:NAME, hf:NAME:CONFIG@SPLIT or hf:FOLDER")
        return cls(name, config or None, split or "train")

    @property
    def local(self) -> Path | None:
        path = Path(self.name).expanduser()
        return path if path.is_dir() else None

    def identity(self) -> dict[str, Any]:
        """What the prepared cache is keyed on: the name, and for a local folder its files' sizes and times."""
        found: dict[str, Any] = {"hf": self.name, "config": self.config, "split": self.split}
        if self.local is not None:
            files = sorted(p for p in self.local.rglob("*") if p.is_file())
            found["files"] = [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in files]
        return found


def hf_documents(spec: DatasetSpec, field: str) -> Iterator[Document]:
    """The dataset's examples as documents, streamed; a missing field is a QkvError naming the columns."""
    dataset = _open(spec)
    columns = getattr(dataset, "column_names", None)
    if columns is not None and field not in columns:
        raise _no_field(spec, field, columns)
    where = f"dataset {spec.name}"
    try:
        for number, example in enumerate(dataset, 1):
            if field not in example:
                raise _no_field(spec, field, list(example))
            text = document_text(example[field], f"{where} example {number}", field)
            if text:
                yield iter([(text, 0)])
    except QkvError:
        raise
    except Exception as error:  # a network failure while streaming, a damaged file, ...
        raise QkvError(f"reading {where} failed ({type(error).__name__}: {error}): check the connection") from None


def _open(spec: DatasetSpec):
    try:
        import datasets
    except ImportError:
        raise QkvError(f"hf:{spec.name} needs the datasets package: {DATA_EXTRA}") from None
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    _quiet_hub_retries()
    local = spec.local
    try:
        if local is not None and ((local / "state.json").is_file() or (local / "dataset_dict.json").is_file()):
            dataset = datasets.load_from_disk(str(local))  # memory-mapped Arrow files
            if isinstance(dataset, datasets.DatasetDict):
                if spec.split not in dataset:
                    raise QkvError(
                        f"{local} has no split {spec.split!r} (it has {', '.join(dataset)}): add @SPLIT, "
                        f"e.g. hf:{spec.name}@{next(iter(dataset))}"
                    )
                dataset = dataset[spec.split]
            return dataset
        if local is None:
            check_hub_reachable(spec)
        return datasets.load_dataset(spec.name, spec.config, split=spec.split, streaming=True)
    except QkvError:
        raise
    except Exception as error:  # offline, unknown name, no such config or split: the library's own errors
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}".rstrip(": ")
        raise QkvError(
            f"could not open the Hugging Face dataset {spec.name!r} ({reason}): check the name, config and "
            "split and that you are online, or save the dataset to a folder and pass hf:FOLDER"
        ) from None


def check_hub_reachable(spec: DatasetSpec) -> None:
    """QkvError at once when the Hub cannot be reached (no network, no DNS). In offline mode the library
    fails at once by itself; behind a proxy (``HTTPS_PROXY`` and the like) its own connection is left to judge."""
    if any(os.environ.get(name) for name in _OFFLINE_VARIABLES + _PROXY_VARIABLES):
        return
    fix = f"connect to the network, or save the dataset to a folder elsewhere and pass hf:FOLDER for hf:{spec.name}"
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        raise QkvError(f"cannot reach the Hugging Face Hub at {host} ({reason}): {fix}") from None


_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _quiet_hub_retries() -> None:
    """The Hub client's retry warnings ("Retrying in 8s [Retry 4/5]") are not for qkv's users."""
    try:
        from huggingface_hub.utils import logging as hub_logging

        hub_logging.set_verbosity_error()
    except ImportError:
        pass


def _no_field(spec: DatasetSpec, field: str, columns: list[str]) -> QkvError:
    return QkvError(
        f"dataset {spec.name} has no {field!r} column (its columns: {', '.join(map(repr, columns[:8]))}): "
        "name the text column with --text-field"
    )
