// qkv walk-through: a GPT's forward pass on one text, step by step, drawn from POST /v1/walkthrough's JSON
// (qkv.inspect.walkthrough). Plain JavaScript, no build, no external resources. The playground and the
// standalone page written by `qkv lens --html` both run this file; they differ only in where the last step's
// probabilities come from (the server's /v1/next-token, or the page's own copy of the last logits).
// Layers, heads and positions are numbered from 0, as everywhere in qkv (and TransformerLens, Hugging Face).
"use strict";

const QkvWalkthrough = (() => {
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (key === "text") node.textContent = value;
      else if (key === "class") node.className = value;
      else node.setAttribute(key, value);
    }
    for (const child of children) if (child !== null && child !== undefined) node.append(child);
    return node;
  }

  const fmt = (x) => (Math.abs(x) >= 1000 ? x.toFixed(0) : x.toPrecision(4));
  const pct = (p) => `${(100 * p).toFixed(1)}%`;

  /** Blue for negative, white for 0, red for positive; |v| / scale sets the depth. */
  function diverging(v, scale) {
    const t = Math.max(-1, Math.min(1, v / (scale || 1)));
    const mix = (a, b) => Math.round(a + Math.abs(t) * (b - a));
    return t < 0 ? `rgb(${mix(255, 33)},${mix(255, 102)},${mix(255, 172)})` : `rgb(${mix(255, 178)},${mix(255, 24)},${mix(255, 43)})`;
  }
  const sequential = (w) => `rgba(47, 91, 211, ${Math.max(0, Math.min(1, w))})`;

  /**
   * Size ``canvas`` for a grid of rows.length x nCols cells (cellW x cellH) right of the row labels and under the
   * column labels (written upwards; cols may be null), and draw the labels. The attention panel draws its grid
   * with this too. Returns the context and where the grid starts.
   */
  function labelledGrid(canvas, { rows, cols, nCols, cellW, cellH, maxLabelW, maxLabelH, pad }) {
    const ctx = canvas.getContext("2d");
    const font = "12px ui-monospace, Menlo, Consolas, monospace";
    ctx.font = font;
    const labelW = Math.min(maxLabelW, Math.max(...rows.map((r) => ctx.measureText(r).width)) + 10);
    const labelH = cols ? Math.min(maxLabelH, Math.max(...cols.map((c) => ctx.measureText(c).width)) + 10) : 4;
    const width = labelW + cellW * nCols + pad, height = labelH + cellH * rows.length + pad;
    const ratio = window.devicePixelRatio || 1;
    Object.assign(canvas, { width: width * ratio, height: height * ratio });
    Object.assign(canvas.style, { width: `${width}px`, height: `${height}px` });
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = font;
    ctx.fillStyle = "#1d2330";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    rows.forEach((r, i) => ctx.fillText(r, labelW - 6, labelH + cellH * (i + 0.5), labelW - 8));
    ctx.textAlign = "left";
    (cols || []).forEach((c, j) => {
      ctx.save();
      ctx.translate(labelW + cellW * (j + 0.5), labelH - 6);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(c, 0, 0, labelH - 8);
      ctx.restore();
    });
    return { ctx, labelW, labelH };
  }

  /**
   * A heatmap on a canvas: rows x cols cells, row labels on the left, optional column labels on top.
   * Clicking a cell calls onPick(i, j); the canvas keeps its geometry in dataset for tests.
   */
  function heatmap(matrix, { rows, cols, colour, cellW, cellH, label, onPick }) {
    const canvas = el("canvas", { role: "img", "aria-label": label, class: "wt-heatmap" });
    const { ctx, labelW, labelH } = labelledGrid(canvas, {
      rows, cols, nCols: matrix[0].length, cellW, cellH, maxLabelW: 140, maxLabelH: 100, pad: 2,
    });
    const gap = cellW > 4 ? 1 : 0;
    matrix.forEach((row, i) => row.forEach((v, j) => {
      ctx.fillStyle = colour(v);
      ctx.fillRect(labelW + cellW * j, labelH + cellH * i, cellW - gap, cellH - 1);
    }));
    Object.assign(canvas.dataset, { labelW, labelH, cellW, cellH, rows: matrix.length, cols: matrix[0].length });
    canvas.addEventListener("click", (event) => {
      const box = canvas.getBoundingClientRect();
      const j = Math.floor((event.clientX - box.left - labelW) / cellW);
      const i = Math.floor((event.clientY - box.top - labelH) / cellH);
      if (i >= 0 && j >= 0 && i < matrix.length && j < matrix[0].length) onPick(i, j);
    });
    return canvas;
  }

  function absMax(matrix) {
    let m = 0;
    for (const row of matrix) for (const v of row) m = Math.max(m, Math.abs(v));
    return m || 1;
  }

  /** Horizontal bars, one per token: |x| of the residual stream (or of a vector). */
  function normBars(tokens, norms, max, onPick) {
    const list = el("div", { class: "wt-norms", role: "list" });
    tokens.forEach((token, i) => {
      const row = el("div", { class: "wt-norm", role: "listitem", "data-position": i, tabindex: "0" },
        el("span", { class: "wt-tok", text: `${i} ${token}` }),
        el("span", { class: "wt-track" }, el("span", { class: "wt-bar" })),
        el("span", { class: "wt-num", text: fmt(norms[i]) }));
      row.querySelector(".wt-bar").style.width = `${(100 * norms[i]) / (max || 1)}%`;
      row.addEventListener("click", () => onPick(i));
      list.append(row);
    });
    return list;
  }

  function lensTable(tokens, lens, detail, where) {
    const table = el("table", { class: "wt-lens" });
    table.append(el("tr", {}, el("th", { text: "position" }), el("th", { text: "would predict" }), el("th", { text: "P" })));
    lens.forEach((topAt, i) => {
      const best = topAt[0];
      const row = el("tr", { "data-position": i, tabindex: "0" },
        el("td", { text: `${i} ${tokens[i]}` }), el("td", { class: "wt-pred", text: best.token }),
        el("td", { class: "wt-num", text: pct(best.probability) }));
      row.addEventListener("click", () => {
        detail.textContent = `${where}, position ${i} (${JSON.stringify(tokens[i])}): the logit lens's top tokens are `
          + topAt.map((t) => `${JSON.stringify(t.token)} (id ${t.id}) ${pct(t.probability)}`).join(", ");
      });
      table.append(row);
    });
    return table;
  }

  // -------------------------------------------------------------------------------------- the steps

  function tokensStep(data) {
    const detail = el("p", { class: "wt-detail", "aria-live": "polite", text: "Click a token for its id." });
    const chips = el("div", { class: "wt-chips" });
    data.tokens.forEach((token, i) => {
      const chip = el("button", { type: "button", class: "wt-chip", "data-position": i },
        el("span", { class: "wt-chip-tok", text: token }), el("span", { class: "wt-chip-id", text: String(data.ids[i]) }));
      chip.addEventListener("click", () => {
        detail.textContent = `position ${i}: token ${JSON.stringify(token)} has id ${data.ids[i]} (the row of W_E it selects)`;
      });
      chips.append(chip);
    });
    return el("section", { class: "wt-step", id: "wt-tokens" },
      el("h3", { text: "1. Tokens" }),
      el("p", { class: "hint", text: `The tokenizer cuts the text into ${data.tokens.length} tokens; each is an id into the vocabulary.` }),
      chips, detail);
  }

  function embeddingStep(data) {
    const e = data.embedding;
    const detail = el("p", { class: "wt-detail", "aria-live": "polite", text: "Click a cell or a bar for its numbers." });
    const d = data.d_model;
    const cellW = Math.max(1, Math.min(12, Math.floor(640 / d)));
    const scale = Math.max(absMax(e.token), e.position ? absMax(e.position) : 0, absMax(e.sum));
    const rows = data.tokens.map((t, i) => `${i} ${t}`);
    const pick = (i, j) => {
      const pos = e.position ? ` + position ${fmt(e.position[i][j])}` : "";
      detail.textContent = `position ${i} (${JSON.stringify(data.tokens[i])}), dimension ${j}: token ${fmt(e.token[i][j])}${pos}`
        + ` = ${fmt(e.sum[i][j])}`;
    };
    const maps = el("div", { class: "wt-maps" });
    const panels = [["token vectors W_E[id]", e.token, "wt-emb-token"]];
    if (e.position) panels.push([`position vectors (${data.positional})`, e.position, "wt-emb-position"]);
    panels.push(["their sum x₀ (the residual stream)", e.sum, "wt-emb-sum"]);
    for (const [title, matrix, id] of panels) {
      const canvas = heatmap(matrix, { rows, colour: (v) => diverging(v, scale), cellW, cellH: 16, label: title, onPick: pick });
      canvas.id = id;
      maps.append(el("figure", {}, el("figcaption", { text: title }), canvas));
    }
    const positional = e.position ? "" : ` This model adds no position vector here (${data.positional}: positions act inside attention).`;
    const norms = normBars(data.tokens, e.norms, Math.max(...e.norms), (i) => {
      const parts = [`|token| ${fmt(e.token_norms[i])}`];
      if (e.position_norms) parts.push(`|position| ${fmt(e.position_norms[i])}`);
      detail.textContent = `position ${i} (${JSON.stringify(data.tokens[i])}): ${parts.join(", ")}, |x₀| ${fmt(e.norms[i])}`;
    });
    return el("section", { class: "wt-step", id: "wt-embedding" },
      el("h3", { text: "2. Embeddings" }),
      el("p", { class: "hint", text: `Each token becomes a vector of ${d} numbers (a row of W_E), plus a vector for its position.`
        + `${positional} Red is positive, blue negative.` }),
      maps,
      el("div", { class: "wt-columns" },
        el("div", {}, el("h4", { text: "|x₀| per token" }), norms),
        el("div", {}, el("h4", { text: "logit lens on x₀ (no blocks at all)" }),
          lensTable(data.tokens, e.lens, detail, "after the embedding"))),
      detail);
  }

  /** Blocks shown open when a model has many: the first two and the last two (the rest open on a click). */
  const OPEN_ALL = 6;
  const openAtFirst = (data, layer) => data.n_layers <= OPEN_ALL || layer < 2 || layer >= data.n_layers - 2;

  function blockStep(data, block, maxNorm, head, open) {
    const last = data.tokens.length - 1;
    const guess = block.lens[last][0];
    const glance = `${JSON.stringify(data.tokens[last])} would be followed by ${JSON.stringify(guess.token)} `
      + `(${pct(guess.probability)}) · |x| ${fmt(block.norms[last])}`;
    const summary = el("summary", { class: "wt-summary" }, el("h3", { text: `Block ${block.layer}` }),
      el("span", { class: "wt-glance", text: glance }));
    const details = el("details", {}, summary);
    const fill = () => details.append(...blockBody(data, block, maxNorm, head));
    if (open) {
      details.open = true;
      fill();
    } else {  // drawn on the first opening: 30 blocks of canvases cost nothing until looked at
      details.addEventListener("toggle", () => { if (details.open && details.children.length === 1) fill(); });
    }
    return el("section", { class: "wt-step wt-block", id: `wt-block-${block.layer}`, "data-layer": block.layer }, details);
  }

  function blockBody(data, block, maxNorm, head) {
    const detail = el("p", { class: "wt-detail", "aria-live": "polite", text: "Click a cell, a bar or a row for its numbers." });
    const heads = block.attention;
    const picker = el("select", { class: "wt-head", "aria-label": `block ${block.layer} head` });
    heads.forEach((_, h) => picker.append(new Option(`head ${h}`, String(h))));
    picker.append(new Option("all heads (mean)", "mean"));
    if ([...picker.options].some((o) => o.value === head)) picker.value = head;
    const rows = data.tokens.map((t, i) => `${i} ${t}`);
    const holder = el("div", { class: "wt-attention" });
    const matrixFor = (value) => (value === "mean"
      ? heads[0].map((row, q) => row.map((_, k) => heads.reduce((s, h) => s + h[q][k], 0) / heads.length))
      : heads[Number(value)]);
    const draw = () => {
      const matrix = matrixFor(picker.value);
      const cell = Math.max(10, Math.min(28, Math.floor(420 / data.tokens.length)));
      const canvas = heatmap(matrix, {
        rows, cols: rows, colour: sequential, cellW: cell, cellH: cell, label: `block ${block.layer} attention`,
        onPick: (i, j) => {
          detail.textContent = `block ${block.layer}, ${picker.value === "mean" ? "mean of the heads" : `head ${picker.value}`}: `
            + `position ${i} (${JSON.stringify(data.tokens[i])}) looks at position ${j} (${JSON.stringify(data.tokens[j])}) `
            + `with weight ${matrix[i][j].toFixed(4)}`;
        },
      });
      canvas.classList.add("wt-attention-map");
      holder.replaceChildren(canvas);
    };
    picker.addEventListener("change", draw);
    draw();
    const norms = normBars(data.tokens, block.norms, maxNorm, (i) => {
      const before = block.layer === 0 ? data.embedding.norms[i] : data.blocks[block.layer - 1].norms[i];
      detail.textContent = `position ${i} (${JSON.stringify(data.tokens[i])}): |x| after block ${block.layer} is `
        + `${fmt(block.norms[i])} (it was ${fmt(before)} before the block)`;
    });
    return [
      el("p", { class: "hint", text: "Masked self-attention: each token looks at itself and the tokens before it; then the MLP. "
        + "Both add their output to the residual stream." }),
      el("div", { class: "wt-columns" },
        el("div", {}, el("h4", { text: "attention weights (row: query, column: key)" }),
          el("div", { class: "row" }, el("label", { text: "Head" }), picker), holder),
        el("div", {}, el("h4", { text: `|x| after block ${block.layer}` }), norms),
        el("div", {}, el("h4", { text: `logit lens after block ${block.layer}` }),
          lensTable(data.tokens, block.lens, detail, `after block ${block.layer}`))),
      detail,
    ];
  }

  function finalStep(data, probabilities, previous) {
    const slider = (id, label, attrs) => {
      const input = el("input", { id, type: "range", ...attrs });
      if (previous && previous[id] !== undefined) input.value = previous[id];
      const out = el("output", { for: id });
      return [el("div", { class: "control" }, el("label", { for: id }, `${label} `, out), input), input, out];
    };
    const [tBox, temperature, tOut] = slider("wt-temperature", "Temperature T", { min: 0, max: 2, step: 0.05, value: 1 });
    const [kBox, topK, kOut] = slider("wt-top-k", "Top-k", { min: 0, max: 50, step: 1, value: 0 });
    const [pBox, topP, pOut] = slider("wt-top-p", "Top-p", { min: 0.05, max: 1, step: 0.05, value: 1 });
    const chart = el("div", { class: "wt-probs", role: "list", "aria-label": "next-token probabilities", "data-version": "0" });
    const summary = el("p", { class: "summary", "aria-live": "polite" });
    const detail = el("p", { class: "wt-detail", "aria-live": "polite", text: "Click a token for its logit." });
    let seq = 0;
    const settings = () => ({
      temperature: Number(temperature.value),
      top_k: Number(topK.value) > 0 ? Number(topK.value) : null,
      top_p: Number(topP.value) < 1 ? Number(topP.value) : null,
    });
    const update = async () => {
      const s = settings();
      tOut.textContent = s.temperature === 0 ? "0 (greedy)" : s.temperature.toFixed(2);
      kOut.textContent = s.top_k === null ? "off" : String(s.top_k);
      pOut.textContent = s.top_p === null ? "off" : s.top_p.toFixed(2);
      const mine = ++seq;
      let result;
      try {
        result = await probabilities(s);
      } catch (error) {
        if (mine === seq) summary.textContent = error.message;
        return;
      }
      if (mine !== seq) return;
      chart.replaceChildren(...result.tokens.map((t) => {
        const row = el("div", { class: `bar-row${t.prob === 0 ? " removed" : ""}`, role: "listitem", tabindex: "0" },
          el("span", { class: "tok", text: t.label }),
          el("div", { class: "track" }, el("div", { class: "bar" }), el("div", { class: "mark" })),
          el("span", { class: "pct", text: pct(t.prob) }));
        row.querySelector(".bar").style.width = `${100 * t.prob}%`;
        row.querySelector(".mark").style.left = `calc(${100 * t.prob_t1}% - 1px)`;
        row.addEventListener("click", () => {
          detail.textContent = `${JSON.stringify(t.label)} (id ${t.id}): logit ${t.logit.toFixed(4)}, `
            + `probability ${t.prob.toFixed(4)} with these settings, ${t.prob_t1.toFixed(4)} at T = 1 without filters`;
        });
        return row;
      }));
      chart.dataset.version = String(Number(chart.dataset.version) + 1);
      summary.textContent = `${result.kept.toLocaleString()} token(s) can be drawn; entropy ${result.entropy_bits.toFixed(2)} bits.`;
    };
    for (const input of [temperature, topK, topP]) input.addEventListener("input", update);
    update();
    const last = data.tokens.length - 1;
    return el("section", { class: "wt-step", id: "wt-final" },
      el("h3", { text: "Unembedding and probabilities" }),
      el("p", { class: "hint", text: `At the last position (${last}, ${JSON.stringify(data.tokens[last])}) the model applies `
        + `${data.norm === "final LayerNorm" ? "its final LayerNorm" : "no final norm"} and W_U: one logit per vocabulary entry. `
        + "p = softmax(top-p(top-k(logits / T))); the mark is the model's own probability (T = 1, no filter)." }),
      el("div", { class: "controls" }, tBox, kBox, pBox), chart, summary, detail);
  }

  /**
   * Draw the walk-through of `data` (POST /v1/walkthrough's JSON) into `root`. `probabilities(settings)`
   * resolves to {tokens: [{id, label, logit, prob, prob_t1}], kept, entropy_bits} for
   * settings {temperature, top_k, top_p}.
   */
  function render(root, data, probabilities) {
    // Redrawn for a new text, the view keeps the heads picked, the blocks opened and the slider settings.
    const heads = {}, opened = {};
    for (const section of root.querySelectorAll("section.wt-block")) {
      const picker = section.querySelector("select.wt-head");
      if (picker) heads[section.dataset.layer] = picker.value;
      opened[section.dataset.layer] = section.querySelector("details").open;
    }
    const sliders = {};
    for (const input of root.querySelectorAll("#wt-final input[type=range]")) sliders[input.id] = input.value;
    const maxNorm = Math.max(...data.blocks.flatMap((b) => b.norms), ...data.embedding.norms);
    const open = (layer) => (layer in opened ? opened[layer] : openAtFirst(data, layer));
    root.replaceChildren(tokensStep(data), embeddingStep(data),
      ...data.blocks.map((b) => blockStep(data, b, maxNorm, heads[b.layer], open(b.layer))),
      finalStep(data, probabilities, sliders));
  }

  // ------------------------------------------------- the sampling transform, for a page without a server

  /** softmax(top_p(top_k(logits / T))) as qkv.decoding.sampling.sampling_distribution computes it. */
  function samplingDistribution(logits, temperature, topK, topP) {
    const n = logits.length;
    let max = -Infinity;
    for (const x of logits) max = Math.max(max, x);
    if (temperature === 0) {  // greedy: all the mass on the largest logit, split between exact ties
      const ties = logits.filter((x) => x === max).length;
      return logits.map((x) => (x === max ? 1 / ties : 0));
    }
    let scaled = logits.map((x) => (x - max) / temperature);
    if (topK && topK < n) {
      const kth = [...scaled].sort((a, b) => b - a)[topK - 1];
      scaled = scaled.map((x) => (x < kth ? -Infinity : x));
    }
    if (topP !== null && topP !== undefined && topP < 1) {
      const order = scaled.map((_, i) => i).sort((a, b) => scaled[b] - scaled[a] || a - b);
      const probs = softmax(order.map((i) => scaled[i]));
      let before = 0;
      order.forEach((i, rank) => {
        if (rank > 0 && before >= topP) scaled[i] = -Infinity;
        before += probs[rank];
      });
    }
    return softmax(scaled);
  }

  function softmax(xs) {
    let max = -Infinity;
    for (const x of xs) max = Math.max(max, x);
    const e = xs.map((x) => Math.exp(x - max));
    const sum = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / sum);
  }

  /** A probabilities() for render() from the page's own data.logits and data.vocab (the standalone page). */
  function localProbabilities(data, n = 15) {
    const order = data.logits.map((_, i) => i).sort((a, b) => data.logits[b] - data.logits[a] || a - b).slice(0, n);
    const model = softmax(data.logits);
    return async ({ temperature, top_k, top_p }) => {
      const p = samplingDistribution(data.logits, temperature, top_k, top_p);
      const entropy = -p.reduce((s, x) => s + (x > 0 ? x * Math.log2(x) : 0), 0);
      return {
        tokens: order.map((i) => ({ id: i, label: data.vocab[i], logit: data.logits[i], prob: p[i], prob_t1: model[i] })),
        kept: p.filter((x) => x > 0).length,
        entropy_bits: entropy,
      };
    };
  }

  return { render, samplingDistribution, localProbabilities, labelledGrid };
})();
