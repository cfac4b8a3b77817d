"""The habits that keep qkv readable, checked: small files, short functions, a test file for every server module.

Offenders that exist today are listed by name in :data:`LONG_FUNCTIONS` and :data:`LONG_FILES`, to burn down:
the test fails on any new one, and on a listed one that has been fixed (so the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

import qkv

PACKAGE = Path(qkv.__file__).parent
TESTS = Path(__file__).parent
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60

LONG_FILES: set[str] = set()
LONG_FUNCTIONS: set[str] = set()


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def long_files() -> set[str]:
    return {
        str(p.relative_to(PACKAGE)) for p in modules() if p.read_text(encoding="utf-8").count("\n") > MAX_FILE_LINES
    }


def long_functions() -> set[str]:
    found = set()
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:  # type: ignore[operator]
                    found.add(f"{path.relative_to(PACKAGE)}:{node.name}")
    return found


def test_no_new_file_over_400_lines_and_the_list_only_shrinks() -> None:
    found = long_files()
    assert found - LONG_FILES == set(), f"files over {MAX_FILE_LINES} lines: split them"
    assert LONG_FILES - found == set(), "these are short now: remove them from LONG_FILES"


def test_no_new_function_over_60_lines_and_the_list_only_shrinks() -> None:
    found = long_functions()
    assert found - LONG_FUNCTIONS == set(), f"functions over {MAX_FUNCTION_LINES} lines: split them"
    assert LONG_FUNCTIONS - found == set(), "these are short now: remove them from LONG_FUNCTIONS"


def test_every_server_module_has_a_test_file_of_its_name() -> None:
    server = PACKAGE / "server"
    missing = []
    for path in sorted(server.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        relative = path.relative_to(server)
        expected = TESTS / "server" / relative.parent / f"test_{path.stem}.py"
        if not expected.is_file():
            missing.append(str(expected.relative_to(TESTS)))
    assert missing == [], "server modules without a test file of their own name"
