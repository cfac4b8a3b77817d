// qkv playground: the walk-through panel. It asks POST /v1/walkthrough for the current prompt and hands the
// answer to walkthrough.js (QkvWalkthrough.render), with /v1/next-token as the source of the last step's
// probabilities. Loaded before app.js, whose helpers ($, state, post) it uses when called.
"use strict";

async function updateWalkthrough() {
  const prompt = $("prompt").value;
  const view = $("walkthrough-view");
  if (prompt === state.walkthroughText) return;  // already shown (or on its way) for this very text
  state.walkthroughText = prompt;
  const seq = ++state.walkthroughSeq;
  view.dataset.state = "loading";
  $("walkthrough-status").textContent = "Running the model…";
  try {
    if (!prompt) throw new Error("Type some text first.");
    const data = await post("/v1/walkthrough", { text: prompt });
    if (seq !== state.walkthroughSeq) return;
    // The last step's numbers are the server's (qkv next's), for the same prompt.
    const probabilities = async (s) => post("/v1/next-token", { prompt, n: 15, ...s });
    QkvWalkthrough.render(view, data, probabilities);
    $("walkthrough-status").textContent = `${data.tokens.length} tokens through ${data.n_layers} blocks of `
      + `${data.n_heads} heads (d_model ${data.d_model}).`;
    view.dataset.state = "shown";
  } catch (error) {
    if (seq !== state.walkthroughSeq) return;
    state.walkthroughText = null;  // let the same text be tried again
    view.dataset.state = "error";
    $("walkthrough-status").textContent = error.message;
  }
}

function toggleWalkthrough() {
  const view = $("walkthrough-view");
  const open = view.hidden;
  view.hidden = !open;
  if (!open) state.walkthroughText = null;  // reopening runs the model again
  $("show-walkthrough").setAttribute("aria-expanded", String(open));
  $("show-walkthrough").textContent = open ? "Hide the walk-through" : "Walk through";
  if (open) updateWalkthrough();
}

let walkthroughTimer = null;

/** Follow the prompt while the panel is open, once the typing pauses. */
function updateWalkthroughSoon() {
  clearTimeout(walkthroughTimer);
  walkthroughTimer = setTimeout(() => { if (!$("walkthrough-view").hidden) updateWalkthrough(); }, 500);
}
