"""The import graph of qkv: no circles, and no module imports from a floor above its own.

Every import counts, at the top of a module or inside a function: a lazy import still makes a circle, it only
hides it until the function runs. An import under ``if TYPE_CHECKING:`` never runs, so it makes no circle,
but it still counts for the floors (a lower floor does not even name a higher one). Importing ``qkv.a.b``
runs ``qkv/a/__init__.py`` first, so a module outside ``qkv.a`` that imports ``qkv.a.b`` depends on
``qkv.a`` too. (tests/layers/test_layering.py checks the same for the layers alone.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import qkv

ROOT = Path(qkv.__file__).parent

FLOORS = [  # low to high; a module's floor is that of the longest prefix naming it
    ("foundations", ["qkv.errors", "qkv.io", "qkv.sharded", "qkv.version", "qkv.devices"]),
    ("kernels in C, built on first use", ["qkv.native"]),
    ("tokenizers", ["qkv.tokenizers"]),
    ("layers", ["qkv.layers"]),
    ("GGUF, llama.cpp's format: the file, its blocks, names and tokenizer", ["qkv.gguf"]),
    ("the step-by-step teaching classes (Raschka, ch. 3)", ["qkv.teaching"]),
    ("storage: safetensors files, the run folder's layout", ["qkv.storage", "qkv.run_dir"]),
    ("models and their families", ["qkv.models"]),
    ("int8 layers, GPTQ, quantization.json", ["qkv.quantization"]),
    ("the model folder, a LoRA adapter folder", ["qkv.model_dir", "qkv.adapter_dir"]),
    ("chat templates: rendering, a conversation's ids", ["qkv.chat_templates"]),
    ("decoding: sampling, generation, beam search, the engine", ["qkv.decoding"]),
    ("data", ["qkv.data"]),
    ("Hugging Face conversion", ["qkv.pretrained"]),
    ("opening any model: qkv.load", ["qkv.loading"]),
    ("the Translator, which opens models with qkv.load", ["qkv.decoding.translator"]),
    ("training", ["qkv.training"]),
    ("what uses a trained model: views, export, qkv quantize", ["qkv.inspect", "qkv.export", "qkv.quantization.save"]),
    ("server", ["qkv.server"]),
    ("command line and the package's front door", ["qkv.cli", "qkv.__main__", "qkv"]),
]  # "qkv" names the package's __init__ only, not every module in it


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST, typing_only: bool = False):
    """(imported name, what it imports from it, under TYPE_CHECKING?) for every import in ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for inner in child.body:
                yield from _imports(ast.Module(body=[inner], type_ignores=[]), True)
            for inner in child.orelse:
                yield from _imports(ast.Module(body=[inner], type_ignores=[]), typing_only)
            continue
        if isinstance(child, ast.Import):
            yield from ((alias.name, [], typing_only) for alias in child.names)
        elif isinstance(child, ast.ImportFrom):
            yield child, [alias.name for alias in child.names], typing_only
        yield from _imports(child, typing_only)


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Every qkv module's qkv imports: (those that run, those only a type checker reads)."""
    modules = module_names()
    runs: dict[str, set[str]] = {name: set() for name in modules}
    type_only: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target, names, typing_only in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(target, ast.ImportFrom):
                base = package
                for _ in range(max(target.level - 1, 0)):
                    base = base.rpartition(".")[0]
                target = f"{base}.{target.module or ''}".strip(".") if target.level else target.module or ""
            if not (target == "qkv" or target.startswith("qkv.")):
                continue
            found = {_resolve(f"{target}.{n}", modules) for n in names if f"{target}.{n}" in modules}
            found = found or {_resolve(target, modules)}
            for module in list(found):  # the packages around it run first
                parts = module.split(".")  # type: ignore[union-attr]
                around = {".".join(parts[:i]) for i in range(2, len(parts))}
                found |= {p for p in around if not (name == p or name.startswith(p + "."))}
            (type_only if typing_only else runs)[name] |= {m for m in found if m and m != name}
    return runs, type_only


def floor_of(module: str) -> int:
    best, floor = -1, -1
    for index, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            inside = module == prefix or (prefix != "qkv" and module.startswith(prefix + "."))
            if inside and len(prefix) > best:
                best, floor = len(prefix), index
    return floor


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each with one circle in it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while component[-1:] != [v]:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(_circle(graph, sorted(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _circle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One path from the component's first module back to itself, inside the component."""
    start, inside = component[0], set(component)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & inside):
            if w == start:
                return path + [start]
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    return component


def test_every_module_has_a_floor() -> None:
    assert [m for m in module_names() if floor_of(m) < 0] == [], "add the new modules to FLOORS"


def test_no_import_circles() -> None:
    runs, _ = import_graph()
    found = cycles(runs)
    assert found == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_import_circles_even_through_type_only_imports() -> None:
    runs, type_only = import_graph()
    found = cycles({name: runs[name] | type_only[name] for name in runs})
    assert found == [], "import circles (type-only imports included):\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_module_imports_from_a_higher_floor() -> None:
    runs, type_only = import_graph()
    upward = [
        f"{a} ({FLOORS[floor_of(a)][0]}) imports {b} ({FLOORS[floor_of(b)][0]})"
        for graph in (runs, type_only)
        for a in sorted(graph)
        for b in sorted(graph[a])
        if floor_of(b) > floor_of(a)
    ]
    assert upward == [], "imports from a higher floor:\n" + "\n".join(upward)


def test_the_graph_sees_lazy_and_package_imports() -> None:
    runs, _ = import_graph()
    assert "qkv.loading" in runs["qkv"]  # qkv.load, imported inside __getattr__
    assert {"qkv.pretrained", "qkv.pretrained.loader"} <= runs["qkv.loading"]  # the package's __init__ runs too
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
