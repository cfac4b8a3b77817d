"""Translate text with a trained encoder-decoder: sentences in, sentences out.

    from qkv.decoding.translator import Translator
    translator = Translator.load("runs/translate-...")     # or a Marian folder, "Helsinki-NLP/opus-mt-en-fr"
    translator.translate(["le 3 mars 2021"])            # ['2021-03-03']
    translator.score(sources, references)              # sacrebleu BLEU and chrF

Each batch of sentences is tokenized, padded (with a padding mask), encoded once, and decoded greedily or
with beam search (:mod:`qkv.decoding.beam_search`); sources longer than the model's maximum are cropped.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.nn.utils.rnn import pad_sequence

from qkv.decoding.beam_search import Hypothesis, beam_search, greedy_decode
from qkv.decoding.configs import translator_config
from qkv.decoding.fast_step import resolve_step
from qkv.errors import QkvError
from qkv.loading import load
from qkv.model_dir import ModelBundle
from qkv.models.family import TRANSLATOR, family_of
from qkv.models.memory import check_kv_pool
from qkv.tokenizers import Tokenizer

if TYPE_CHECKING:
    from qkv.models.rnnsearch import RNNSearch
    from qkv.models.transformer import Transformer


@dataclass
class Scores:
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    bleu_text: str  # sacrebleu's one-line summary, e.g. "BLEU = 35.2 66.1/42.0/28.5/19.4 (BP = ...)"

    def as_dict(self) -> dict[str, float | str]:
        return dict(self.__dict__)


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    """sacrebleu's corpus BLEU and chrF of ``hypotheses`` against one reference each."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise QkvError(
            f"there are {len(hypotheses)} translations but {len(references)} references: give one reference per line"
        )
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return Scores(b.score, c.score, str(bleu.get_signature()), str(chrf.get_signature()), str(b))


class Translator:
    """A trained encoder-decoder (a Transformer or RNNSearch) with its source and target tokenizers."""

    def __init__(
        self,
        model: torch.nn.Module,
        source_tokenizer: Tokenizer,
        target_tokenizer: Tokenizer | None = None,
        *,
        step: str = "auto",
    ):
        resolve_step(model, step)
        self.model = cast("Transformer | RNNSearch", model)  # what beam search decodes
        self.step = step  # how the decoder steps run (qkv.decoding.fast_step)
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer or source_tokenizer
        target = self.target_tokenizer
        if target.bos_id is None or target.eos_id is None:
            raise QkvError("the target tokenizer has no <bos> or <eos> token: a translator needs both to decode")
        self.cropped = 0  # sources cropped to the model's maximum length so far
        self.empty = 0  # empty sources so far (translated as empty, not decoded)

    @classmethod
    def from_bundle(cls, bundle: ModelBundle, *, step: str = "auto") -> Translator:
        """The translator for a loaded model; a model whose family is no translator is a QkvError."""
        family_of(bundle.model).require_role(TRANSLATOR, f"translating with {bundle.path}")
        return cls(bundle.model, bundle.tokenizer, bundle.target_tokenizer, step=step)

    @classmethod
    def load(cls, path: str | Path, *, device: str = "cpu", step: str = "auto") -> Translator:
        """Open any model :func:`qkv.load` opens (a run, a quantized folder, a Marian folder, a Hub name) that
        is a translator."""
        return cls.from_bundle(load(path, device=device), step=step)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode_sources(self, sentences: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids (B, S) and padding mask (B, S) of ``sentences``, cropped to the model's max_len."""
        limit = translator_config(self.model).context_length
        ids = []
        for sentence in sentences:
            tokens = self.source_tokenizer.encode(sentence)
            if len(tokens) > limit:
                self.cropped += 1
                warnings.warn(
                    f"a source sentence of {len(tokens)} tokens was cropped to the model's maximum of {limit}",
                    stacklevel=3,
                )
                tokens = tokens[:limit]
            if not tokens:
                tokens = [self.source_tokenizer.unk_id if self.source_tokenizer.unk_id is not None else 0]
            ids.append(torch.tensor(tokens, dtype=torch.long))
        pad = self.source_tokenizer.pad_id if self.source_tokenizer.pad_id is not None else 0
        src = pad_sequence(ids, batch_first=True, padding_value=pad)
        lengths = torch.tensor([len(t) for t in ids])
        mask = torch.arange(src.shape[1])[None, :] >= lengths[:, None]
        return src.to(self.device), mask.to(self.device)

    def translate_n_best(
        self,
        sentences: Sequence[str],
        *,
        beam: int = 4,
        n_best: int = 1,
        length_penalty: float = 1.0,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        batch_size: int = 32,
    ) -> list[list[tuple[str, float]]]:
        """For every sentence, the ``n_best`` translations with their scores, best first. An empty sentence (or one
        of spaces) is not decoded: its translation is empty, and :attr:`empty` counts it."""
        _check_settings(sentences, beam, n_best, batch_size, max_len_a, max_len_b)
        weight = next(p for p in self.model.parameters() if p.is_floating_point())
        rows = min(batch_size, len(sentences)) * beam  # the decoder's rows: sentences x beam
        config = translator_config(self.model)
        check_kv_pool(config, rows, config.context_length, weight.dtype, weight.device,
                      fix="translate fewer sentences at once (batch_size) or with a smaller beam")  # fmt: skip
        results: list[list[tuple[str, float]]] = [[("", 0.0)] for _ in sentences]
        spoken = [i for i, sentence in enumerate(sentences) if isinstance(sentence, str) and sentence.strip()]
        self.empty += len(sentences) - len(spoken)
        target = self.target_tokenizer
        for start in range(0, len(spoken), batch_size):
            chunk = spoken[start : start + batch_size]
            src, mask = self.encode_sources([sentences[i] for i in chunk])
            common: dict[str, Any] = dict(  # bos_id and eos_id: checked when the translator was made
                bos_id=target.bos_id, eos_id=target.eos_id, max_len_a=max_len_a, max_len_b=max_len_b, step=self.step
            )
            if beam == 1 and n_best == 1:
                outputs = [[Hypothesis(tokens, 0.0, 0.0)] for tokens in greedy_decode(self.model, src, mask, **common)]
            else:
                outputs = beam_search(
                    self.model, src, mask, beam_size=beam, n_best=n_best, length_penalty=length_penalty, **common
                )
            for i, hypotheses in zip(chunk, outputs, strict=True):
                results[i] = [(target.decode(h.tokens), h.score) for h in hypotheses]
        return results

    def translate(self, sentences: Sequence[str], *, beam: int = 4, **kwargs) -> list[str]:
        """The best translation of every sentence."""
        return [n_best[0][0] for n_best in self.translate_n_best(sentences, beam=beam, **kwargs)]

    def score(self, sources: Sequence[str], references: Sequence[str], *, beam: int = 4, **kwargs) -> Scores:
        """Translate ``sources`` and compare with ``references``: sacrebleu BLEU and chrF."""
        if len(sources) != len(references):
            raise QkvError(
                f"there are {len(sources)} source sentences but {len(references)} references: the files must be "
                "line-aligned"
            )
        return corpus_scores(self.translate(sources, beam=beam, **kwargs), references)


def _check_settings(sentences, beam: int, n_best: int, batch_size: int, max_len_a: float, max_len_b: int) -> None:
    """What ``qkv translate`` refuses, refused here too (the Python API, the server): one line naming the setting."""
    if isinstance(sentences, str):
        raise QkvError("sentences must be a list of strings: wrap one sentence in a list, [sentence]")
    if not all(isinstance(s, str) for s in sentences):
        raise QkvError("every sentence must be a string")
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if not whole(beam) or beam < 1 or not whole(n_best) or not 1 <= n_best <= beam:
        raise QkvError(f"beam={beam!r} must be a whole number >= 1 and n_best={n_best!r} between 1 and beam")
    if not whole(batch_size) or batch_size < 1:
        raise QkvError(f"batch_size={batch_size!r} must be a whole number >= 1")
    if not whole(max_len_b) or max_len_b < 0 or not max_len_a >= 0:
        raise QkvError(f"max_len_a={max_len_a!r} and max_len_b={max_len_b!r} must not be negative")
