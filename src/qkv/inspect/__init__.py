"""See inside: the sources' numbers and pictures, on any qkv model, trained or not.

Every view reads the model's own forward pass through :func:`qkv.layers.capture.capture` (one light
mechanism: named activations handed back when asked), never a second implementation:

- :mod:`~qkv.inspect.explain`: one attention head step by step with real numbers: tokens, embeddings
  (+ positions), Q, K, V, Q K^T, / sqrt(d_k), the causal mask, the softmax, the weighted sum of values,
  the heads concatenated and W_o (``qkv explain``); :mod:`~qkv.inspect.examples` holds Raschka's and the Attention Is
  All You Need notes' examples;
- :mod:`~qkv.inspect.attention_maps`: every layer's and head's attention weights, drawn by
  :func:`~qkv.inspect.figures.draw_attention` and :mod:`~qkv.inspect.html_view` (``qkv attention``);
- :mod:`~qkv.inspect.next_token`: the next-token distribution at several temperatures (``qkv next``);
- :mod:`~qkv.inspect.embeddings`: nearest neighbours, analogies, a 2-D map of W_E and the positional
  table (``qkv embeddings``);
- interpretability, on the residual stream (:mod:`~qkv.inspect.residual`): the logit lens
  (:mod:`~qkv.inspect.lens`, ``qkv lens``), direct logit attribution (:mod:`~qkv.inspect.attribution`,
  ``qkv attribute``), activation patching (:mod:`~qkv.inspect.patching`, ``qkv patch``) and the head detector
  (:mod:`~qkv.inspect.heads`, ``qkv heads``), drawn by :mod:`~qkv.inspect.circuit_figures`;
- :mod:`~qkv.inspect.walkthrough`: a GPT's whole forward pass step by step (tokens, embeddings, every block's
  attention, residual norm and logit lens, the unembedding), shown by the playground and by
  :mod:`~qkv.inspect.walkthrough_html` (``qkv lens --html``).

>>> from qkv.inspect import explain_example
>>> explain_example("quick-fox").weights[1].round(4).tolist()   # "quick" attending to each token
[0.0976, 0.1333, 0.1819, 0.2483, 0.3389]
"""

from qkv.inspect.attention_maps import AttentionGroup, AttentionMaps, attention_maps, maps_from_trace
from qkv.inspect.attribution import Attribution, attribute
from qkv.inspect.circuit_figures import draw_attribution, draw_head_scores, draw_logit_lens, draw_patching
from qkv.inspect.embeddings import (
    analogy,
    analogy_of,
    cosine_similarities,
    embedding_matrix,
    nearest_neighbours,
    neighbours_of,
    pca_2d,
    positional_table,
)
from qkv.inspect.examples import EXAMPLES, explain_example, read_matrices
from qkv.inspect.explain import (
    Explanation,
    explain_attention,
    explain_given,
    explain_projected,
    explain_without_weights,
)
from qkv.inspect.explain_model import explain_model
from qkv.inspect.explain_view import render_explanation
from qkv.inspect.figures import (
    Picture,
    draw_attention,
    draw_embedding_map,
    draw_next_token,
    draw_positional_table,
    png_size,
)
from qkv.inspect.heads import HeadDetection, HeadScores, detect_heads
from qkv.inspect.html_view import attention_html, write_attention_html
from qkv.inspect.lens import LogitLens, logit_lens
from qkv.inspect.next_token import NextToken, next_token
from qkv.inspect.patching import Patching, PatchMap, patch
from qkv.inspect.trace import Trace, trace
from qkv.inspect.walkthrough import Walkthrough, walkthrough
from qkv.inspect.walkthrough_html import walkthrough_html, write_walkthrough_html

__all__ = [
    "EXAMPLES",
    "AttentionGroup",
    "AttentionMaps",
    "Attribution",
    "Explanation",
    "HeadDetection",
    "HeadScores",
    "LogitLens",
    "NextToken",
    "PatchMap",
    "Patching",
    "Picture",
    "Trace",
    "Walkthrough",
    "analogy",
    "analogy_of",
    "attention_html",
    "attention_maps",
    "attribute",
    "cosine_similarities",
    "detect_heads",
    "draw_attribution",
    "draw_attention",
    "draw_embedding_map",
    "draw_head_scores",
    "draw_logit_lens",
    "draw_next_token",
    "draw_patching",
    "draw_positional_table",
    "embedding_matrix",
    "explain_attention",
    "explain_example",
    "explain_given",
    "explain_model",
    "explain_projected",
    "explain_without_weights",
    "logit_lens",
    "maps_from_trace",
    "nearest_neighbours",
    "neighbours_of",
    "next_token",
    "patch",
    "pca_2d",
    "png_size",
    "positional_table",
    "read_matrices",
    "render_explanation",
    "trace",
    "walkthrough",
    "walkthrough_html",
    "write_attention_html",
    "write_walkthrough_html",
]
