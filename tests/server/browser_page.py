"""What the browser tests share (tests/server/test_browser*.py): which Chromium drives the page, where screenshots
go, and the skip that says why when Chromium or Playwright is absent. Importing this module from a test module
skips that module then. The ``browser`` and ``page`` fixtures are tests/server/conftest.py's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("QKV_CHROMIUM", "/usr/bin/chromium"))  # another build: set QKV_CHROMIUM
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "server"

if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} is absent: install Debian's chromium and chromium-driver packages "
        "(apt-get install chromium chromium-driver; .ci/run does) to run the browser tests",
        allow_module_level=True,
    )
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is absent: pip install playwright (the test extra)"
)


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path
