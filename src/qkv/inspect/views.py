"""One object for a notebook: a loaded model with every view as a method (``qkv.views``).

    import qkv
    m = qkv.views("runs/shakespeare")        # what qkv.load opens, plus the views below
    m.attention("The quick brown fox")       # every layer and head, a head picker and hover, in the output
    m.next_token("The quick", temperatures=(0.5, 1, 2))
    m.lens("The quick brown fox")            # the logit lens: a heatmap and the numbers
    m.generate("The", max_new_tokens=40)     # text, one token at a time with the KV cache

Each method is a thin wrapper over one function of :mod:`qkv.inspect` (its docstring names it) and returns
that function's result, which shows itself in Jupyter and VS Code (``_repr_html_``, ``_repr_png_``) and keeps
every number as attributes (``.to_dict()`` for JSON). :class:`ModelViews` *is* a
:class:`~qkv.model_dir.ModelBundle` (``m.model``, ``m.tokenizer``, ``m.config``, ``m.path``), so anything that
takes a bundle takes it.

Why a subclass here and not methods on ModelBundle itself: the model folder sits on a lower floor than the
views (tests/test_imports.py), and a lower floor never imports a higher one, not even inside a function.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from qkv.errors import QkvError
from qkv.inspect.attention_maps import AttentionMaps, attention_maps
from qkv.inspect.attribution import Attribution, attribute
from qkv.inspect.embedding_views import EmbeddingMap, Neighbours, PositionalTable, analogy, embedding_map, neighbours
from qkv.inspect.embedding_views import positions as positional_view
from qkv.inspect.explain import Explanation
from qkv.inspect.explain_model import explain_model
from qkv.inspect.heads import HeadDetection, detect_heads
from qkv.inspect.lens import LogitLens, logit_lens
from qkv.inspect.next_token import NextToken, next_token
from qkv.inspect.patching import Patching, patch
from qkv.inspect.tokens import token_labels
from qkv.inspect.walkthrough import Walkthrough, walkthrough
from qkv.loading import load
from qkv.model_dir import ModelBundle


class ModelViews(ModelBundle):
    """A :class:`~qkv.model_dir.ModelBundle` with the views of :mod:`qkv.inspect` as methods."""

    @classmethod
    def of(cls, bundle: ModelBundle) -> ModelViews:
        """The same model, tokenizers and path (nothing copied)."""
        return cls(**{f.name: getattr(bundle, f.name) for f in fields(ModelBundle)})

    def __repr__(self) -> str:
        size = sum(p.numel() for p in self.model.parameters())
        return f"ModelViews({str(self.path)!r}: {type(self.model).__name__}, {size:,} parameters)"

    def tokens(self, text: str) -> list[tuple[int, str]]:
        """``text`` through the tokenizer: (id, piece) for each token (the pieces as the views label them)."""
        ids = self.tokenizer.encode(text)
        return list(zip(ids, token_labels(self.tokenizer, ids), strict=True))

    def explain(self, text: str, *, layer: int = 0, head: int = 0, **options: Any) -> Explanation:
        """One head step by step, Q, K, V to W_o (:func:`~qkv.inspect.explain_model.explain_model`,
        ``qkv explain``); ``options``: part, causal, query, target."""
        return explain_model(self, text, layer=layer, head=head, **options)

    def attention(self, text: str, *, target: str | None = None) -> AttentionMaps:
        """Every layer's and head's weights (:func:`~qkv.inspect.attention_maps.attention_maps`,
        ``qkv attention``); a translator reads ``text`` as the source and ``target`` (default: its own
        translation)."""
        return attention_maps(self, text, target=target)

    def next_token(self, text: str, *, temperatures: Sequence[float] = (0.5, 1.0, 2.0), **options: Any) -> NextToken:
        """P(next token | text) at each temperature (:func:`~qkv.inspect.next_token.next_token`, ``qkv next``);
        ``options``: top, target_prefix, top_k, top_p."""
        return next_token(self, text, temperatures=temperatures, **options)

    def generate(self, prompt: str, *, max_new_tokens: int = 50, temperature: float = 1.0, **options: Any) -> str:
        """``prompt`` continued by :func:`qkv.decoding.generate` (a KV cache, one token per step): the new text.
        ``options``: top_k, top_p, generator, use_cache; temperature 0 is greedy."""
        from qkv.decoding import generate
        from qkv.models.family import LANGUAGE_MODEL, family_of

        family_of(self.model).require_role(LANGUAGE_MODEL, "generating text")
        tokenizer = self.tokenizer
        prompt_ids = tokenizer.encode(prompt)
        ids = generate(self.model, prompt_ids, max_new_tokens=max_new_tokens, temperature=temperature,
                       eos_id=tokenizer.eos_id, bos_id=tokenizer.bos_id, **options)  # fmt: skip
        return tokenizer.decode(ids[0, len(prompt_ids) :].tolist())

    def translate(self, text: str | Sequence[str], *, beam: int = 4) -> str | list[str]:
        """A translator's best translation (:class:`~qkv.decoding.translator.Translator`, beam search)."""
        from qkv.decoding.translator import Translator

        sentences = [text] if isinstance(text, str) else list(text)
        if not any(isinstance(s, str) and s.strip() for s in sentences):
            raise QkvError("there is nothing to translate: the text is empty; give a sentence (or a list of them)")
        translator = Translator.from_bundle(self)
        found = translator.translate(sentences, beam=beam)
        if translator.empty:
            warnings.warn(f"{translator.empty} of the {len(sentences)} sentences are empty: their translations are "
                          "empty", stacklevel=2)  # fmt: skip
        return found[0] if isinstance(text, str) else found

    def neighbours(self, token: str, *, k: int = 5, target: bool = False) -> Neighbours:
        """The tokens nearest to ``token`` in W_E by cosine (``qkv embeddings --neighbours``)."""
        return neighbours(self, token, k=k, target=target)

    def analogy(self, a: str, b: str, c: str, *, k: int = 5, target: bool = False) -> Neighbours:
        """a - b + c on W_E, nearest tokens (``qkv embeddings --analogy``): king - man + woman."""
        return analogy(self, a, b, c, k=k, target=target)

    def embedding_map(self, *, tokens: list[str] | None = None, top: int | None = None) -> EmbeddingMap:
        """W_E's rows on their first two principal components (``qkv embeddings --plot``)."""
        return embedding_map(self, tokens=tokens, top=top)

    def positions(self, *, length: int = 64) -> PositionalTable:
        """The positional encodings the model adds (``qkv embeddings --positions``)."""
        return positional_view(self, length=length)

    def lens(self, text: str, *, target: str | None = None, top: int = 5) -> LogitLens:
        """What every layer would predict (:func:`~qkv.inspect.lens.logit_lens`, ``qkv lens``)."""
        return logit_lens(self, text, target=target, top=top)

    def attribute(self, text: str, **options: Any) -> Attribution:
        """Each part's and head's share of one logit (:func:`~qkv.inspect.attribution.attribute`,
        ``qkv attribute``); ``options``: target, foil, position, prefix."""
        return attribute(self, text, **options)

    def patch(self, clean: str, corrupt: str, **options: Any) -> Patching:
        """Activation patching, clean into corrupt (:func:`~qkv.inspect.patching.patch`, ``qkv patch``);
        ``options``: target, foil, prefix."""
        return patch(self, clean, corrupt, **options)

    def heads(self, **options: Any) -> HeadDetection:
        """Previous-token, induction, ... scores of every head (:func:`~qkv.inspect.heads.detect_heads`,
        ``qkv heads``); ``options``: length, batch, seed, bos."""
        return detect_heads(self, **options)

    def walkthrough(self, text: str, *, top: int = 5) -> Walkthrough:
        """The whole forward pass of a GPT, with live temperature (:func:`~qkv.inspect.walkthrough.walkthrough`,
        ``qkv lens --html``)."""
        return walkthrough(self, text, top=top, vocab=True)


def views(
    model: str | Path | ModelBundle, *, device: str | torch.device = "cpu", dequantize: bool = True
) -> ModelViews:
    """:class:`ModelViews` of ``model``: a bundle already loaded, or anything :func:`qkv.load` opens (a run
    folder, a quantized folder, a Hugging Face folder, a GGUF file, a Hub name). A GGUF file's 4- and 8-bit
    matrices are read as float32 (``dequantize``): the views show the file's numbers, computed without the
    rounding of activations that quantized products add, as the ``qkv`` inspection verbs do."""
    bundle = model if isinstance(model, ModelBundle) else load(model, device=device, dequantize=dequantize)
    return bundle if isinstance(bundle, ModelViews) else ModelViews.of(bundle)
