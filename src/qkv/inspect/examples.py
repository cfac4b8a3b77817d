"""The sources' worked examples, and reading your own matrices from a JSON or CSV file.

The notes on Attention Is All You Need ("The quick brown fox jumps"): 4-dimensional embeddings and, instead of
learned projections,
"simplified transformations" that give 2-dimensional Q, K and V directly; the seed then focuses on the
query of "quick". Raschka, ch. 3 ("Your journey starts with one step", LLMs-from-scratch chapter 3): six tokens
embedded in 3 dimensions; section 3.3.1 attends with no trainable weights (query x^(2), "journey"), and
section 3.4 adds W_query, W_key, W_value drawn with ``torch.manual_seed(123); torch.rand(3, 2)``.

File formats for your own numbers (``qkv explain --qkv FILE`` / ``--embeddings FILE``):

- JSON, whole matrices: ``{"tokens": ["The", ...], "Q": [[0.1, 0.2], ...], "K": [...], "V": [...]}``, or
  ``{"tokens": [...], "X": [[...], ...], "W_q": [[...]], "W_k": ..., "W_v": ..., "W_o": ...}`` (each W is
  (d_in, d_out) and multiplies from the right, x W; any W left out is drawn at random).
- JSON, one entry per token, as the notes on Attention Is All You Need list them: ``{"The": {"Q": [0.1, 0.2], "K":
[...], "V": [...]},
  "quick": {...}}`` (or ``{"The": [0.1, 0.2, 0.3, 0.4], ...}`` for embeddings).
- CSV with a header: an optional first column ``token``, then numbered columns per matrix, e.g.
  ``token,q1,q2,k1,k2,v1,v2`` or ``token,x1,x2,x3``.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import numpy as np

from qkv.errors import QkvError
from qkv.inspect.explain import Explanation, explain_given, explain_projected, explain_without_weights
from qkv.io import read_json, read_text

QUICK_FOX_TOKENS = ["The", "quick", "brown", "fox", "jumps"]
QUICK_FOX_EMBEDDINGS = [
    [0.1, 0.2, 0.3, 0.4],
    [0.5, 0.6, 0.7, 0.8],
    [0.9, 1.0, 1.1, 1.2],
    [1.3, 1.4, 1.5, 1.6],
    [1.7, 1.8, 1.9, 2.0],
]
QUICK_FOX_Q = [[0.1, 0.2], [0.5, 0.6], [0.9, 1.0], [1.3, 1.4], [1.7, 1.8]]
QUICK_FOX_K = [[0.2, 0.1], [0.6, 0.5], [1.0, 0.9], [1.4, 1.3], [1.8, 1.7]]
QUICK_FOX_V = [[0.3, 0.4], [0.7, 0.8], [1.1, 1.2], [1.5, 1.6], [1.9, 2.0]]

JOURNEY_TOKENS = ["Your", "journey", "starts", "with", "one", "step"]
JOURNEY_INPUTS = [
    [0.43, 0.15, 0.89],  # Your     (x^1)
    [0.55, 0.87, 0.66],  # journey  (x^2)
    [0.57, 0.85, 0.64],  # starts   (x^3)
    [0.22, 0.58, 0.33],  # with     (x^4)
    [0.77, 0.25, 0.10],  # one      (x^5)
    [0.05, 0.80, 0.55],  # step     (x^6)
]

EXAMPLES = {
    "quick-fox": "the notes on Attention Is All You Need: one head on 'The quick brown fox jumps' with their given "
    "Q, K, V",
    "journey": "Raschka, Build a Large Language Model (From Scratch), section 3.3.1: attention without trainable "
    "weights on 'Your journey starts with one step'",
    "journey-weights": "Raschka, Build a Large Language Model (From Scratch), section 3.4: W_query, W_key, W_value = "
    "torch.rand(3, 2) after torch.manual_seed(123)",
}
OLD_NAMES = {"004": "quick-fox", "003": "journey", "003-weights": "journey-weights"}  # accepted, no longer shown
DEFAULT_QUERY = {"quick-fox": "quick", "journey": "journey", "journey-weights": "journey"}


def example_name(name: str) -> str:
    """The example ``name`` stands for (its own name, or an old one); QkvError for one that is not an example."""
    name = OLD_NAMES.get(name, name)
    if name not in EXAMPLES:
        raise QkvError(f"unknown example {name!r}: choose one of {', '.join(EXAMPLES)}")
    return name


def explain_example(
    name: str = "quick-fox",
    *,
    causal: bool = False,
    query: str | int | None = None,
    seed: int = 123,
    d_k: int = 2,
    n_heads: int = 1,
    head: int = 0,
) -> Explanation:
    """One of :data:`EXAMPLES` explained; ``query`` defaults to the token the seed focuses on."""
    name = example_name(name)
    query = DEFAULT_QUERY[name] if query is None else query
    if name == "quick-fox":
        explanation = explain_given(
            QUICK_FOX_TOKENS, QUICK_FOX_Q, QUICK_FOX_K, QUICK_FOX_V, causal=causal, query=query, title=EXAMPLES[name]
        )
        explanation.embeddings = np.array(QUICK_FOX_EMBEDDINGS)
        return explanation
    if name == "journey":
        title = EXAMPLES[name]
        return explain_without_weights(JOURNEY_TOKENS, JOURNEY_INPUTS, causal=causal, query=query, title=title)
    return explain_projected(
        JOURNEY_TOKENS,
        JOURNEY_INPUTS,
        seed=seed,
        d_k=d_k,
        n_heads=n_heads,
        head=head,
        causal=causal,
        query=query,
        title=EXAMPLES[name],
    )


# ------------------------------------------------------------------------------------ reading files

_ALIASES = {
    "q": "Q", "queries": "Q", "query": "Q",
    "k": "K", "keys": "K", "key": "K",
    "v": "V", "values": "V", "value": "V",
    "x": "X", "embeddings": "X", "inputs": "X", "e": "X",
    "w_q": "W_q", "wq": "W_q", "w_query": "W_q",
    "w_k": "W_k", "wk": "W_k", "w_key": "W_k",
    "w_v": "W_v", "wv": "W_v", "w_value": "W_v",
    "w_o": "W_o", "wo": "W_o", "out_proj": "W_o",
}  # fmt: skip


def _canonical(name: str, path: Path) -> str:
    key = _ALIASES.get(name.strip().lower())
    if key is None:
        raise QkvError(
            f"{path} has an entry {name!r} that is not a matrix name: use tokens, Q, K, V, X, W_q, W_k, W_v or W_o"
        )
    return key


def _matrix(rows: Any, name: str, path: Path) -> np.ndarray:
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise QkvError(f"{name} in {path} must be a list of rows (lists of numbers): fix the file")
    widths = {len(r) for r in rows}
    if len(widths) != 1 or 0 in widths:
        raise QkvError(f"the rows of {name} in {path} have different lengths {sorted(widths)}: give equal rows")
    try:
        matrix = np.array(rows, dtype=np.float64)
    except (TypeError, ValueError):
        matrix = None
    if matrix is None or matrix.ndim != 2:
        raise QkvError(f"{name} in {path} holds something that is not a number: fix the file")
    return matrix


def _from_json(data: Any, path: Path) -> tuple[list[str] | None, dict[str, np.ndarray]]:
    if not isinstance(data, dict) or not data:
        raise QkvError(f'{path} must hold a JSON object of matrices, e.g. {{"Q": [[...]], ...}}: fix the file')

    def vector(v: Any) -> bool:
        return isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)

    if all(isinstance(v, dict) for v in data.values()) or all(vector(v) for v in data.values()):
        return _per_token(data, path)  # {"The": {"Q": [...], ...}, ...} or {"The": [0.1, ...], ...}
    tokens = data.get("tokens")
    if tokens is not None and (not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens)):
        raise QkvError(f"'tokens' in {path} must be a list of strings: fix the file")
    matrices = {_canonical(k, path): _matrix(v, k, path) for k, v in data.items() if k != "tokens"}
    return tokens, matrices


def _per_token(data: dict[str, Any], path: Path) -> tuple[list[str], dict[str, np.ndarray]]:
    tokens = list(data)
    if all(isinstance(v, list) for v in data.values()):
        return tokens, {"X": _matrix(list(data.values()), "the embeddings", path)}
    if not all(isinstance(v, dict) for v in data.values()):
        raise QkvError(f"{path} mixes per-token lists and objects: give every token the same form")
    names = {tuple(sorted(v)) for v in data.values()}
    if len(names) != 1:
        raise QkvError(f"the tokens in {path} do not all give the same matrices: give each token Q, K and V")
    rows = {_canonical(n, path): [data[t][n] for t in tokens] for n in data[tokens[0]]}
    return tokens, {name: _matrix(r, name, path) for name, r in rows.items()}


def _from_csv(text: str, path: Path) -> tuple[list[str] | None, dict[str, np.ndarray]]:
    rows = [r for r in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in r)]
    if len(rows) < 2:
        raise QkvError(f"{path} needs a header and one row per token: fix the file")
    header = [h.strip() for h in rows[0]]
    has_tokens = header[0].lower() in ("token", "tokens", "word")
    columns: dict[str, list[int]] = {}
    for j, name in enumerate(header[1:] if has_tokens else header, start=int(has_tokens)):
        group = re.sub(r"[\s_\[\]()]*\d+[\])]*$", "", name)
        if not group or group == name:
            raise QkvError(
                f"column {name!r} in {path} is not a numbered matrix column: name them like q1,q2,k1,k2,v1,v2 or x1,x2"
            )
        columns.setdefault(_canonical(group, path), []).append(j)
    tokens = [r[0].strip() for r in rows[1:]] if has_tokens else None
    matrices = {}
    for name, js in columns.items():
        values = []
        for line, row in enumerate(rows[1:], start=2):
            if len(row) != len(header):
                raise QkvError(f"line {line} of {path} has {len(row)} cells but the header has {len(header)}: fix it")
            try:
                values.append([float(row[j]) for j in js])
            except ValueError:
                raise QkvError(f"line {line} of {path} has a cell that is not a number: fix it") from None
        matrices[name] = np.array(values)
    return tokens, matrices


def read_matrices(path: str | Path) -> tuple[list[str] | None, dict[str, np.ndarray]]:
    """Tokens (or None) and the matrices ("Q", "K", "V", "X", "W_q", ...) in a JSON or CSV file."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return _from_csv(read_text(path, what="matrix file"), path)
    if path.suffix.lower() == ".json":
        return _from_json(read_json(path, what="matrix file"), path)
    raise QkvError(f"{path} is neither .json nor .csv: give the matrices in one of those formats")


def check_tokens(file_tokens: list[str] | None, text_tokens: list[str] | None, n_rows: int, path: Path) -> list[str]:
    """The tokens to label ``n_rows`` rows with: the file's, the text's (they must agree), or t0, t1, ..."""
    tokens = file_tokens or text_tokens
    if file_tokens and text_tokens and file_tokens != text_tokens:
        raise QkvError(f"the text's tokens {text_tokens} differ from those in {path} {file_tokens}: give one of them")
    if tokens is None:
        tokens = [f"t{i}" for i in range(n_rows)]
    if len(tokens) != n_rows:
        raise QkvError(f"{path} has {n_rows} rows but there are {len(tokens)} tokens: give one row per token")
    return tokens
