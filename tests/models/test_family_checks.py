"""The verbs, the server and the views ask a family's description what a model can do; they do not test kinds.

A "kind check" is code outside :mod:`qkv.models.family` that knows a family by name: a comparison with a
model kind ("gpt", ``config.kind``, ``TRANSLATORS``), an ``isinstance`` on a model or config class, or a
table keyed by kind names. The count in cli/, server/ and inspect/ must stay at most 10 (issue 21); every
check found is listed when the test fails, so a new one is easy to find and fold into the description.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import qkv
from qkv.models.family import families

PACKAGE = Path(qkv.__file__).parent
SURFACE = ("cli", "server", "inspect")
LIMIT = 10
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


def kind_checks() -> list[str]:
    """Every kind check in cli/, server/ and inspect/ (Python and the playground's JavaScript)."""
    checks: list[str] = []
    for folder in SURFACE:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            checks += python_checks(path)
        for path in sorted((PACKAGE / folder).rglob("*.js")):
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


def test_cli_server_and_inspect_ask_the_description_instead_of_testing_kinds():
    checks = kind_checks()
    assert len(checks) <= LIMIT, f"{len(checks)} kind checks (at most {LIMIT}):\n" + "\n".join(checks)
