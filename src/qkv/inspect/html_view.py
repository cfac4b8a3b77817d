"""A standalone HTML page for exploring attention maps: pick the kind, layer and head; hover to read a weight.

One file, no network: the styles, the script and the weights (as JSON) are all inside it, so it opens from
disk in any browser, offline, and can be mailed or committed. Hovering a cell shows "query -> key: weight"
(row i, column j of softmax(Q K^T / sqrt(d_k) + mask)); hovering a row's label shows how that query's
weight is spread over the key tokens, written under the map as the tokens themselves shaded by weight.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING

from qkv.io import atomic_write_text

if TYPE_CHECKING:
    from qkv.inspect.view_types import AttentionMapsView

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.2em; margin-bottom: 0.2em; }
.controls { margin: 0.8em 0; display: flex; gap: 1.2em; flex-wrap: wrap; }
.controls label { font-size: 0.9em; }
select { font-size: 0.95em; padding: 2px 4px; }
#map { display: grid; gap: 1px; background: #fff; width: max-content; }
#map div { font-size: 11px; }
.cell { width: 22px; height: 22px; }
.cell:hover { outline: 2px solid #e6550d; }
.qlabel { text-align: right; padding-right: 6px; white-space: pre; line-height: 22px; cursor: default; }
.klabel { writing-mode: vertical-rl; transform: rotate(180deg); white-space: pre; padding-top: 4px; }
#readout { font-family: ui-monospace, monospace; margin: 0.8em 0; min-height: 1.4em; }
#spread span { padding: 1px 3px; margin: 1px; display: inline-block; border-radius: 3px; white-space: pre; }
.note { color: #666; font-size: 0.85em; max-width: 60em; }
"""

_SCRIPT = """
const DATA = JSON.parse(document.getElementById("attention-data").textContent);
const groupSel = document.getElementById("group");
const layerSel = document.getElementById("layer");
const headSel = document.getElementById("head");
const map = document.getElementById("map");
const readout = document.getElementById("readout");
const spread = document.getElementById("spread");

function colour(w) {  // white (weight 0) to dark blue (weight 1)
  const t = Math.max(0, Math.min(1, w));
  const mix = (a, b) => Math.round(a - t * (a - b));
  return "rgb(" + mix(247, 8) + "," + mix(251, 48) + "," + mix(255, 107) + ")";
}

function fill(select, n, prefix) {
  select.innerHTML = "";
  for (let i = 0; i < n; i++) {
    const option = document.createElement("option");
    option.value = i;
    option.textContent = prefix + i;
    select.appendChild(option);
  }
}

function showSpread(g, row, w) {  // the query's weights written on the key tokens themselves
  spread.innerHTML = "";
  const label = document.createElement("b");
  label.textContent = g.query_tokens[row] + " attends to: ";
  spread.appendChild(label);
  g.key_tokens.forEach(function (token, j) {
    const span = document.createElement("span");
    span.textContent = token;
    span.style.background = colour(w[row][j]);
    span.style.color = w[row][j] > 0.55 ? "white" : "black";
    span.title = w[row][j].toFixed(4);
    spread.appendChild(span);
  });
}

function draw() {
  const g = DATA.groups[groupSel.value];
  const w = g.weights[+layerSel.value][+headSel.value];  // (queries, keys)
  const nKeys = g.key_tokens.length;
  map.innerHTML = "";
  map.style.gridTemplateColumns = "max-content repeat(" + nKeys + ", 22px)";
  g.query_tokens.forEach(function (query, i) {
    const label = document.createElement("div");
    label.className = "qlabel";
    label.textContent = query;
    label.addEventListener("mouseenter", function () { showSpread(g, i, w); });
    map.appendChild(label);
    for (let j = 0; j < nKeys; j++) {
      const cell = document.createElement("div");
      cell.className = "cell";
      cell.style.background = colour(w[i][j]);
      cell.dataset.weight = w[i][j];
      cell.addEventListener("mouseenter", function () {
        readout.textContent = "query " + i + " " + JSON.stringify(query) + "  ->  key " + j + " " +
          JSON.stringify(g.key_tokens[j]) + ":  " + w[i][j].toFixed(4);
        showSpread(g, i, w);
      });
      map.appendChild(cell);
    }
  });
  map.appendChild(document.createElement("div"));
  g.key_tokens.forEach(function (key) {
    const label = document.createElement("div");
    label.className = "klabel";
    label.textContent = key;
    map.appendChild(label);
  });
  const causal = g.causal ? " (causal: above the diagonal every weight is 0)" : "";
  document.getElementById("title").textContent = g.title + causal;
}

function pickGroup() {
  const g = DATA.groups[groupSel.value];
  fill(layerSel, g.weights.length, "layer ");
  fill(headSel, g.weights[0].length, "head ");
  draw();
}

Object.keys(DATA.groups).forEach(function (name) {
  const option = document.createElement("option");
  option.value = name;
  option.textContent = DATA.groups[name].title;
  groupSel.appendChild(option);
});
if ("cross" in DATA.groups) groupSel.value = "cross";  // a translator opens on its alignment, as the playground does
groupSel.addEventListener("change", pickGroup);
layerSel.addEventListener("change", draw);
headSel.addEventListener("change", draw);
pickGroup();
"""


def attention_html(maps: AttentionMapsView, *, title: str = "Attention maps", digits: int = 4) -> str:
    """The page as a string: controls, the map, and every group's weights embedded as JSON."""
    data = json.dumps(maps.to_dict(digits), ensure_ascii=False, separators=(",", ":"))
    data = data.replace("</", "<\\/")  # a token such as "</script>" must not end the data block
    source = " ".join(maps.source_tokens)
    lines = [f"<p class='note'>Source: {html.escape(source)}</p>"]
    if maps.target_tokens is not None:
        made = " (the model's greedy translation)" if maps.generated else ""
        lines.append(f"<p class='note'>Target{made}: {html.escape(' '.join(maps.target_tokens))}</p>")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
{"".join(lines)}
<p class="note">Row i is a query token, column j a key token; the cell is the attention weight
softmax(Q K<sup>T</sup> / &radic;d<sub>k</sub>)<sub>ij</sub>, so every row sums to 1. Hover a cell to read it,
or a row label to see that token's weight spread over the keys.</p>
<div class="controls">
<label>attention <select id="group"></select></label>
<label>layer <select id="layer"></select></label>
<label>head <select id="head"></select></label>
</div>
<h2 id="title" style="font-size:1em"></h2>
<div id="map"></div>
<div id="readout">hover a cell</div>
<div id="spread"></div>
<script type="application/json" id="attention-data">{data}</script>
<script>{_SCRIPT}</script>
</body>
</html>
"""


def write_attention_html(maps: AttentionMapsView, path: str | Path, *, title: str = "Attention maps") -> Path:
    """Write :func:`attention_html` to ``path`` (atomically) and return the path."""
    path = Path(path)
    atomic_write_text(path, attention_html(maps, title=title))
    return path
