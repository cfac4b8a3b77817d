"""The whole package asks a family's description what a model can do; nothing outside the family table tests kinds.

A "kind check" is code outside the families' own folders that knows a family by name: a comparison with a
model kind ("gpt", ``config.kind``, ``TRANSLATORS``), an ``isinstance`` on a model or config class, or a
table keyed by kind names. There must be none anywhere in src/qkv (Python and the playground's JavaScript)
but the ones :data:`TEMPORARY_ALLOWANCE` names; every check found is listed when the test fails, so a new one
is easy to find and fold into the description.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import qkv
from qkv.models.family import families

PACKAGE = Path(qkv.__file__).parent
FAMILY_FOLDERS = {family.config.__module__.split(".")[2] for family in families().values()}  # gpt, llama, ...
"""Each family's own folder (qkv/models/<family>/) may name its own classes; the table lists them by name."""
TEMPORARY_ALLOWANCE: dict[str, int] = {}
"""Files allowed a number of kind checks for now (counted per file, so that edits moving lines keep it)."""
MODEL_CLASSES = {family.model.__name__ for family in families().values()} | {"EncoderDecoder", "Model"}
CONFIG_CLASSES = {family.config.__name__ for family in families().values()}
KINDS = set(families())


def _is_translators(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "TRANSLATORS"


def _is_kind_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in KINDS
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_kind_literal(element) for element in node.elts)
    return False


def python_checks(path: Path, root: Path = PACKAGE) -> list[str]:
    """Lines of ``path`` that test a model kind by name, as "file:line" relative to ``root``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            is_task = any(getattr(side, "attr", getattr(side, "id", None)) == "task" for side in sides)
            if not is_task and any(_is_kind_literal(side) or _is_translators(side) for side in sides):
                found.add(node.lineno)  # (a training task is named "word2vec" too: that is no model kind)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            names = {getattr(n, "id", getattr(n, "attr", None)) for n in ast.walk(node.args[1])}
            if names & (MODEL_CLASSES | CONFIG_CLASSES):
                found.add(node.lineno)
        elif isinstance(node, ast.Dict) and sum(k is not None and _is_kind_literal(k) for k in node.keys) >= 2:
            found.add(node.lineno)
        elif isinstance(node, ast.Name) and node.id == "TRANSLATORS" and isinstance(node.ctx, ast.Load):
            found.add(node.lineno)
    return [f"{path.relative_to(root)}:{line}" for line in sorted(found)]


JS_CHECK = re.compile(r"""kind\s*[!=]==?\s*["'](%s)["']|["'](%s)["']\s*[!=]==?\s*\w*kind""" % (("|".join(KINDS),) * 2))


def javascript_checks(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{path.relative_to(PACKAGE)}:{i}" for i, line in enumerate(lines, 1) if JS_CHECK.search(line)]


def _outside_the_families(path: Path) -> bool:
    parts = path.relative_to(PACKAGE).parts
    return not (parts[0] == "models" and (parts[1] in FAMILY_FOLDERS or parts[1] in ("family.py", "description.py")))


def kind_checks() -> list[str]:
    """Every kind check in src/qkv outside the families' folders (Python and the playground's JavaScript)."""
    checks: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _outside_the_families(path):
            checks += python_checks(path)
    for path in sorted(PACKAGE.rglob("*.js")):
        checks += javascript_checks(path)
    return checks


def test_the_counter_finds_each_form_of_kind_check(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "if config.kind == 'gpt': pass\n"
        "if kind in TRANSLATORS: pass\n"
        "if isinstance(model, GPT): pass\n"
        "TABLE = {'encoder': 1, 'gpt': 2}\n"
        "if family.has('residual stream'): pass\n"  # a question to the description: not a kind check
        "if self.kind == other.kind: pass\n"  # comparing two kinds names none
        "if tokenizer.kind == 'char': pass\n"
        "if config.task == 'word2vec': pass\n",  # a tokenizer's or a task's kind is no model kind
        encoding="utf-8",
    )
    assert python_checks(sample, tmp_path) == ["sample.py:1", "sample.py:2", "sample.py:3", "sample.py:4"]


def _per_file(checks: list[str]) -> dict[str, int]:
    return dict(Counter(check.rpartition(":")[0] for check in checks))


def test_nothing_outside_the_family_table_tests_kinds():
    checks = kind_checks()
    counts = _per_file(checks)
    over = [c for c in checks if counts[c.rpartition(":")[0]] > TEMPORARY_ALLOWANCE.get(c.rpartition(":")[0], 0)]
    assert over == [], f"{len(over)} kind checks (ask the family instead):\n" + "\n".join(over)


def test_the_temporary_allowance_holds_only_checks_that_are_still_there():
    """When the decoding engine asks the family, its checks leave the allowance (and this test says so)."""
    counts = _per_file(kind_checks())
    stale = {file: allowed for file, allowed in TEMPORARY_ALLOWANCE.items() if counts.get(file, 0) < allowed}
    assert stale == {}, f"lower or remove these entries of TEMPORARY_ALLOWANCE: {stale} (found {counts})"
