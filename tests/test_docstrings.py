"""The library's docstrings describe the design: measured figures (speeds, ratios, accuracies) live in docs/,
where a re-measurement updates one page, and no sentence is left cut in the middle by a rewrite."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "qkv"
FIGURE = re.compile(
    r"\d[\d,.]*\s?(sentences|tokens|words)/s|\d(\.\d+)?x (the time|slower|faster)|\d(\.\d+)? points of"
    r"|\d[\d.]* ms (against|vs)"
)


def _docstrings():
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                text = ast.get_docstring(node, clean=False)
                if text:
                    yield f"{path.relative_to(SRC)}:{getattr(node, 'lineno', 1)}", text


def test_no_benchmark_figures_in_library_docstrings() -> None:
    found = [f"{where}: {m.group(0)!r}" for where, text in _docstrings() for m in FIGURE.finditer(text)]
    assert not found, "move these figures to the docs page of the topic:\n" + "\n".join(found)


def test_no_prose_line_cut_short_mid_sentence() -> None:
    """A prose line far shorter than its neighbours, ending without punctuation, whose sentence goes on in
    lower case on the next line: what the citation rewrite left in 14 files."""
    cut = []
    for where, text in _docstrings():
        lines = text.split("\n")
        width = max(len(line) for line in lines)
        base = min((len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()), default=0)
        for line, after in zip(lines, lines[1:], strict=False):
            prose = re.match(rf" {{{base}}}[A-Za-z`:(\"']", line) and re.match(rf" {{{base}}}[a-z]", after)
            if (prose and len(line) < width - 40 and len(line) < 60 and not line.lstrip().startswith(">>>")
                    and not re.search(r"[.:;,)]$|\s{2,}", line.strip())):  # fmt: skip
                cut.append(f"{where}: {line.strip()!r} / {after.strip()[:30]!r}")
    assert not cut, "rejoin these lines:\n" + "\n".join(cut)
