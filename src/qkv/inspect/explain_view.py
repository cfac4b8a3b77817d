"""An :class:`~qkv.inspect.explain.Explanation` printed as a sequence of terminal tables (rich).

Each step gets a heading that names the operation with the sources' symbols and one table of real numbers,
rows labelled by token. Wide matrices (a real model's d_k or d_model columns) are cut to ``max_columns``
with a "…" column; ``qkv explain --json`` has every number. The focused query's row is drawn in bold, and a
last table writes its dot products out term by term, as the notes on Attention Is All You Need do for "quick".
"""

from __future__ import annotations

from functools import partial
from typing import Protocol

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text


class ExplainedHeads(Protocol):
    """Step 9 as this view reads it (:class:`~qkv.inspect.explain.MultiHead`)."""

    @property
    def head_outputs(self) -> np.ndarray: ...  # (h, Tq, d_k)
    @property
    def concat(self) -> np.ndarray: ...  # (Tq, h * d_k)
    @property
    def b_o(self) -> np.ndarray | None: ...  # (d_model,)
    @property
    def output(self) -> np.ndarray: ...  # (Tq, d_model)


class Explained(Protocol):
    """What this view reads of an :class:`~qkv.inspect.explain.Explanation` (declared here, so that the
    result's module can import this view for its notebook rendering without an import circle)."""

    @property
    def title(self) -> str: ...
    @property
    def variant(self) -> str: ...
    @property
    def notes(self) -> list[str]: ...
    @property
    def query_tokens(self) -> list[str]: ...
    @property
    def key_tokens(self) -> list[str]: ...
    @property
    def query(self) -> int | None: ...
    @property
    def embeddings(self) -> np.ndarray | None: ...  # (T, d_model)
    @property
    def positions(self) -> np.ndarray | None: ...  # (T, d_model)
    @property
    def inputs(self) -> np.ndarray | None: ...  # (T, d_in)
    @property
    def projections(self) -> dict[str, np.ndarray]: ...  # (d_in, h * d_k) each
    @property
    def queries(self) -> np.ndarray: ...  # (Tq, d_k)
    @property
    def keys(self) -> np.ndarray: ...  # (Tk, d_k)
    @property
    def values(self) -> np.ndarray: ...  # (Tk, d_v)
    @property
    def scale(self) -> float: ...
    @property
    def causal(self) -> bool: ...
    @property
    def scores(self) -> np.ndarray: ...  # (Tq, Tk)
    @property
    def scaled(self) -> np.ndarray: ...  # (Tq, Tk)
    @property
    def masked(self) -> np.ndarray: ...  # (Tq, Tk)
    @property
    def weights(self) -> np.ndarray: ...  # (Tq, Tk)
    @property
    def output(self) -> np.ndarray: ...  # (Tq, d_v)
    @property
    def n_heads(self) -> int: ...
    @property
    def head(self) -> int: ...
    @property
    def layer(self) -> int | None: ...
    @property
    def heads(self) -> ExplainedHeads | None: ...
    @property
    def model_difference(self) -> float | None: ...
    @property
    def d_k(self) -> int: ...


class MatrixTable(Protocol):
    """:func:`matrix_table` with the renderer's digits, max_columns and width filled in."""

    def __call__(
        self,
        matrix: np.ndarray,
        rows: list[str],
        columns: list[str] | None = None,
        *,
        bold_row: int | None = None,
        title: str | None = None,
        row_sums: bool = False,
    ) -> Table: ...


def _number(value: float, digits: int) -> str:
    if np.isneginf(value):
        return "-inf"
    return f"{value:.{digits}f}"


def matrix_table(
    matrix: np.ndarray,
    rows: list[str],
    columns: list[str] | None = None,
    *,
    digits: int = 4,
    max_columns: int = 10,
    bold_row: int | None = None,
    title: str | None = None,
    row_sums: bool = False,
    width: int | None = None,
) -> Table:
    """A rich table of ``matrix`` (R, C) with one labelled row per token; at most ``max_columns`` columns,
    and no more than fit ``width`` terminal columns (the rest become one "… +N" column)."""
    n_cols = matrix.shape[1]
    columns = columns or [str(j) for j in range(n_cols)]
    fit = n_cols
    if width is not None:
        cell = max([digits + 3] + [len(c) for c in columns[: min(n_cols, max_columns)]]) + 3  # "-0.0123" + " │ "
        labels = max([len(r) for r in rows] + [0]) + 1
        fit = max(1, (width - labels - 9 - (cell if row_sums else 0)) // cell)  # 9: the "… +N" column
        fit = n_cols if fit >= n_cols - 1 and (width - labels - (cell if row_sums else 0)) // cell >= n_cols else fit
    shown = list(range(min(n_cols, max_columns, fit)))
    table = Table(
        title=None if title is None else Text(title, style="italic"),
        title_justify="left",
        show_edge=False,
        pad_edge=False,
        header_style="bold cyan",
    )
    table.add_column("", style="bold", no_wrap=True)
    for j in shown:
        table.add_column(Text(columns[j]), justify="right", no_wrap=True)
    if n_cols > len(shown):
        table.add_column(f"… +{n_cols - len(shown)}", justify="left", style="dim")
    if row_sums:
        table.add_column("row sum", justify="right", style="green")
    for i, label in enumerate(rows):
        cells = [_number(matrix[i, j], digits) for j in shown]
        if n_cols > len(shown):
            cells.append("…")
        if row_sums:
            cells.append(_number(float(np.sum(matrix[i])), digits))
        table.add_row(Text(label), *cells, style="bold yellow" if i == bold_row else None)
    return table


def _heading(console: Console, step: str, text: str) -> None:
    console.print()
    console.rule(Text.assemble((step, "bold magenta"), "  ", text), align="left", style="magenta")


def _focus_table(e: Explained, digits: int) -> Table:
    """The Attention Is All You Need notes' step 4 for one query: q . k_j written out, scaled, softmaxed, and the
    weighted values."""
    i = e.query
    assert i is not None
    q = e.queries[i]
    table = Table(show_edge=False, pad_edge=False, header_style="bold cyan")
    table.add_column("key", no_wrap=True)
    table.add_column("q · k_j", max_width=34, overflow="fold")
    table.add_column("score", justify="right", min_width=digits + 3, no_wrap=True)
    table.add_column("/ sqrt(d_k)" if e.scale != 1.0 else "(no scaling)", justify="right", min_width=digits + 3)
    if e.causal:
        table.add_column("masked", justify="right", min_width=digits + 3, no_wrap=True)
    table.add_column("weight α", justify="right", style="green", min_width=digits + 3, no_wrap=True)
    table.add_column("α · v_j", min_width=12)
    for j, token in enumerate(e.key_tokens):
        k = e.keys[j]
        terms = [f"{a:.{digits}g}×{b:.{digits}g}" for a, b in zip(q, k, strict=True)]
        product = " + ".join(terms) if len(terms) <= 4 else " + ".join(terms[:2]) + f" + … ({len(terms)} terms)"
        weighted = e.weights[i, j] * e.values[j]
        shown = ", ".join(_number(x, digits) for x in weighted[:3]) + (", …" if len(weighted) > 3 else "")
        cells: list[Text | str] = [
            Text(token),
            product,
            _number(e.scores[i, j], digits),
            _number(e.scaled[i, j], digits),
        ]
        if e.causal:
            cells.append(_number(e.masked[i, j], digits))
        cells += [_number(e.weights[i, j], digits), f"[{shown}]"]
        table.add_row(*cells)
    return table


def render_explanation(e: Explained, console: Console | None = None, *, digits: int = 4, max_columns: int = 10) -> None:
    """Print every step of ``e`` to ``console`` (default: a new stdout console)."""
    console = console or Console()
    table = partial(matrix_table, digits=digits, max_columns=max_columns, width=console.width)
    _print_title(console, e)
    _print_tokens(console, e)
    _print_embeddings(console, e, table)
    _print_projections(console, e, table)
    _print_scores(console, e, table, digits)
    _print_output(console, e, table, digits, max_columns)
    _print_heads(console, e, table)
    console.print()
    if console.width < 120:
        console.print(
            Text(
                f"(tables cut to fit {console.width} columns: widen the terminal or set COLUMNS=160, lower --digits, "
                "or use --json for every number)",
                style="dim",
            )
        )


def _print_title(console: Console, e: Explained) -> None:
    """The formula, and the notes on how the numbers were made."""
    console.print(Text(e.title or "Scaled dot-product attention, one head", style="bold"))
    console.print(Text("Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V", style="italic"))
    for note in e.notes:
        console.print(Text(f"note: {note}", style="dim"))


def _print_tokens(console: Console, e: Explained) -> None:
    """Step 1: the tokens, numbered (and the keys' tokens when they are another text)."""
    _heading(console, "1", "Tokens: the text broken into little pieces")
    console.print(Text("  " + "  ".join(f"[{i}] {t}" for i, t in enumerate(e.query_tokens))))
    if e.key_tokens != e.query_tokens:
        keys = "  ".join(f"[{j}] {t}" for j, t in enumerate(e.key_tokens))
        console.print(Text(f"  keys and values come from: {keys}"))


def _print_embeddings(console: Console, e: Explained, table: MatrixTable) -> None:
    """Step 2: x_i = W_E[token_i] (+ PE_i), when the explanation has embeddings or inputs."""
    if e.embeddings is None and e.inputs is None:
        return
    bold, tokens = e.query, e.query_tokens
    plus = " + positions" if e.positions is not None else ""
    _heading(console, "2", f"Embeddings: one vector per token (rows of W_E){plus}")
    if e.embeddings is not None:
        console.print(table(e.embeddings, tokens, title="token embeddings W_E[token]", bold_row=bold))
    if e.positions is not None:
        assert e.inputs is not None  # X = W_E[token] + PE[position] is kept with the positions
        console.print(table(e.positions, tokens, title="positional encodings PE[position]"))
        console.print(table(e.inputs, tokens, title="X = W_E[token] + PE[position]", bold_row=bold))
    elif e.embeddings is None and e.inputs is not None:
        console.print(table(e.inputs, tokens, title="X (given)", bold_row=bold))


def _print_projections(console: Console, e: Explained, table: MatrixTable) -> None:
    """Step 3: where Q, K and V come from (the variant), then the three matrices."""
    d_k, bold = e.d_k, e.query
    head = f" (head {e.head} of {e.n_heads}, d_k = {d_k})" if e.n_heads > 1 else f" (d_k = {d_k})"
    if e.variant == "projected":
        _heading(console, "3", "Projections: q_i = x_i W_q, k_i = x_i W_k, v_i = x_i W_v" + head)
        for n, w in e.projections.items():
            console.print(table(w, [f"row {r}" for r in range(w.shape[0])], title=n))
    elif e.variant == "no-weights":
        _heading(console, "3", "No projections: each token is its own query, key and value (q_i = k_i = v_i = x_i)")
    elif e.variant == "given":
        _heading(console, "3", "Queries, keys, values: given by the example" + head)
    else:
        _heading(console, "3", f"Queries, keys, values of layer {e.layer}" + head)
    console.print(table(e.queries, e.query_tokens, title="Q", bold_row=bold))
    console.print(table(e.keys, e.key_tokens, title="K"))
    console.print(table(e.values, e.key_tokens, title="V"))


def _print_scores(console: Console, e: Explained, table: MatrixTable, digits: int) -> None:
    """Steps 4-7: Q K^T, scaled by 1/sqrt(d_k), masked, softmaxed (and how the model's own weights compare)."""
    bold, rows, columns = e.query, e.query_tokens, e.key_tokens
    _heading(console, "4", "Scores Q K^T: the dot product of every query with every key")
    console.print(table(e.scores, rows, columns, bold_row=bold))
    if e.scale != 1.0:
        _heading(console, "5", f"Scaled by 1/sqrt(d_k) = 1/sqrt({e.d_k}) = {e.scale:.{digits}f}")
        console.print(table(e.scaled, rows, columns, bold_row=bold))
    else:
        _heading(console, "5", "No scaling here (section 3.3.1 scales only once there are trainable weights)")
    if e.causal:
        _heading(console, "6", "Causal mask: -inf where a query would see a later token (e^-inf = 0)")
        console.print(table(e.masked, rows, columns, bold_row=bold))
    else:
        _heading(console, "6", "No mask: every query sees every key (use --causal for the decoder's mask)")
    _heading(console, "7", "Softmax of each row: attention weights, each row sums to 1")
    console.print(table(e.weights, rows, columns, bold_row=bold, row_sums=True))
    if e.model_difference is not None:
        same = e.model_difference < 1e-5
        verdict = "equal to" if same else "differ from"
        console.print(
            Text(
                f"  {verdict} the weights the model computed in its own forward pass "
                f"(max difference {e.model_difference:.1e})",
                style="green" if same else "yellow",
            )
        )


def _print_output(console: Console, e: Explained, table: MatrixTable, digits: int, max_columns: int) -> None:
    """Step 8, A V, then the focused query's row written out term by term."""
    _heading(console, "8", "Output = weights × V: each row a weighted sum of the value vectors")
    console.print(table(e.output, e.query_tokens, bold_row=e.query))
    if e.query is None:
        return
    token = e.query_tokens[e.query]
    _heading(console, "·", f"Focus on the query of {token!r} (row {e.query})")
    console.print(_focus_table(e, digits))
    out = ", ".join(_number(x, digits) for x in e.output[e.query][:max_columns])
    more = ", …" if e.output.shape[1] > max_columns else ""
    console.print(Text(f"  sum of α · v_j = output for {token!r}: [{out}{more}]"))


def _print_heads(console: Console, e: Explained, table: MatrixTable) -> None:
    """Step 9: the heads concatenated, then W_o (+ b_o), for a multi-head layer."""
    if e.heads is None:
        return
    h, bold = e.heads, e.query
    width = h.concat.shape[1]
    bias = " + b_o" if h.b_o is not None else ""
    sizes = f"{e.n_heads} × {h.head_outputs.shape[-1]} = {width} columns"
    _heading(console, "9", f"{e.n_heads} heads concatenated ({sizes}), then × W_o{bias}")
    console.print(table(h.concat, e.query_tokens, title="concat(head 0, head 1, ...)", bold_row=bold))
    title = f"concat W_o{bias}: the layer's output ({h.output.shape[1]} columns)"
    console.print(table(h.output, e.query_tokens, title=title, bold_row=bold))
