"""Translation as a training task: teacher forcing with label smoothing, validated by BLEU.

Teacher forcing (seed 004, "inference vs training"): the decoder is fed the true target shifted right
after ``<bos>`` and learns to predict each next target token, all positions at once (the causal mask
keeps position t from seeing t+1). Label smoothing (the paper, section 5.4) moves a little probability
mass (0.1) from the correct token to all others, which hurts perplexity but helps BLEU. Validation
reports the loss, and decodes held-out sentences to score them with sacrebleu's BLEU and chrF (and the
exact-match rate, the natural measure for the built-in dates task).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.data.translation import TranslationBatch, TranslationBatches
from qkv.decoding.translate import beam_search, greedy_decode
from qkv.decoding.translator import corpus_scores
from qkv.tokenizers import Tokenizer


def translation_loss(logits: Tensor, targets: Tensor, *, pad_id: int, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy over the non-padding target tokens, with label smoothing."""
    return F.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=pad_id, label_smoothing=label_smoothing
    )


def forward_batch(model: nn.Module, batch: TranslationBatch) -> Tensor:
    """Teacher-forced logits (B, T, V). Targets are right-padded, so the causal mask already keeps real
    positions from seeing padding; no target padding mask is needed (and the fast causal kernel is kept)."""
    return model(batch.src, batch.tgt_in, src_padding_mask=batch.src_padding_mask)


class TranslationTask:
    """Length-bucketed training batches; validation loss, BLEU, chrF and exact match on held-out pairs."""

    def __init__(
        self,
        train: TranslationBatches,
        val: TranslationBatches,
        val_references: list[str],
        target_tokenizer: Tokenizer,
        *,
        device: torch.device,
        label_smoothing: float = 0.1,
        eval_batches: int = 20,
        bleu_sentences: int = 500,
        eval_beam: int = 1,
        metric: str = "bleu",
    ) -> None:
        self.train, self.val, self.val_references = train, val, val_references
        self.target_tokenizer, self.device = target_tokenizer, device
        self.label_smoothing, self.eval_batches = label_smoothing, eval_batches
        self.bleu_sentences, self.eval_beam, self.metric = bleu_sentences, eval_beam, metric
        self.higher_is_better = True
        self.pad_id = train.pad_id
        if not bleu_sentences:  # nothing is decoded: the best model is the one with the lowest loss
            self.metric, self.higher_is_better = "val_loss", False

    def state_dict(self) -> dict[str, Any]:
        return self.train.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.train.load_state_dict(state)

    def train_batch(self, rank: int, world_size: int) -> TranslationBatch:
        return self.train.train_batch(rank=rank, world_size=world_size).to(self.device)

    def loss(self, model: nn.Module, batch: TranslationBatch) -> tuple[Tensor, int]:
        logits = forward_batch(model, batch)
        loss = translation_loss(logits, batch.tgt_out, pad_id=self.pad_id, label_smoothing=self.label_smoothing)
        return loss, batch.n_target_tokens

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        total, tokens = 0.0, 0
        for i, batch in enumerate(self.val.eval_batches()):
            if i >= self.eval_batches:
                break
            batch = batch.to(self.device)
            loss = translation_loss(forward_batch(model, batch), batch.tgt_out, pad_id=self.pad_id)
            total += loss.item() * batch.n_target_tokens
            tokens += batch.n_target_tokens
        results = {"val_loss": total / max(tokens, 1)}
        if self.bleu_sentences:
            hypotheses, references = self.decode_validation(model)
            scores = corpus_scores(hypotheses, references)
            exact = sum(h.strip() == r.strip() for h, r in zip(hypotheses, references, strict=True))
            results.update(bleu=scores.bleu, chrf=scores.chrf, exact_match=exact / len(references))
        return results

    def decode_validation(self, model: nn.Module) -> tuple[list[str], list[str]]:
        """Translations of the first ``bleu_sentences`` validation pairs and their references."""
        wanted = min(self.bleu_sentences, self.val.n_pairs)
        outputs: dict[int, list[int]] = {}
        tok = self.target_tokenizer
        for batch in self.val.eval_batches():
            keep = batch.indices < wanted
            if not keep.any():
                continue
            src, mask = batch.src[keep].to(self.device), batch.src_padding_mask[keep].to(self.device)
            width = int((~mask).sum(dim=1).max())
            src, mask = src[:, :width], mask[:, :width]
            common = dict(bos_id=tok.bos_id, eos_id=tok.eos_id)
            if self.eval_beam == 1:
                decoded = greedy_decode(model, src, mask, **common)
            else:
                decoded = [h[0].tokens for h in beam_search(model, src, mask, beam_size=self.eval_beam, **common)]
            for index, tokens in zip(batch.indices[keep].tolist(), decoded, strict=True):
                outputs[index] = tokens
        order = sorted(outputs)
        return [tok.decode(outputs[i]) for i in order], [self.val_references[i] for i in order]
