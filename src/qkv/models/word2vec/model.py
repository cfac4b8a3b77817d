"""Word2Vec (Mikolov et al., 2013): word vectors learned by predicting which words occur near which.

Before attention there were static word vectors. The notes on the mathematics of attention (2024) start
from them: Word2Vec learns one vector per word so that "numerically close (cosine similarity) vectors are
considered semantically similar", by training the model "to predict the word given the context, and the
context given a word" (CBOW and skip-gram). The notes on how GPT works show the same geometry in a GPT's
embedding matrix W_E: E(king) - E(man) + E(woman) lands near E(queen).

The model is two matrices of shape (vocab_size, d_model):

- ``token_embedding``: the input vectors v_w, one row per word. These are the word vectors, W_E, the
  matrix ``qkv embeddings`` reads, exactly as it reads a Transformer's W_E.
- ``output_embedding``: the output vectors v'_w, used only to train the input vectors (word2vec's
  ``syn1neg``).

Negative sampling (Mikolov et al., 2013b) replaces the softmax over the vocabulary by K+1 binary choices:
for an input vector h and the word w that really occurs with it, and K words n_1..n_K drawn from the
unigram distribution raised to 3/4,

    loss = -log sigma(v'_w . h) - sum_k log sigma(-v'_{n_k} . h)

- skip-gram: h = v_c, the vector of one context word c, and w the centre word (one row per pair);
- CBOW: h = the mean of the context words' vectors around the centre word w (one row per centre word).

Plain SGD on this loss, one (h, w) row at a time, is word2vec's update. Here a batch holds many rows at
once (:class:`Word2VecBatch`): every row's gradient comes from the same weights and rows that share a
word add their updates. Two choices keep that fast and close to the one-at-a-time original:

- The rows of a batch are cut into blocks of ``block`` consecutive rows that share their K negative words,
  so the negative scores of a block are one small matrix product (``torch.bmm``), not K separate dot
  products per row (Ji et al., 2016, "Parallelizing Word2Vec in shared and distributed memory").
- A word whose rows together would push it past its own minimum has its summed step shortened
  (:func:`damp_rows`). One at a time, the sigmoid of a frequent word saturates after a few updates and
  stops it moving; added up from the same weights, hundreds of updates overshoot and diverge.

CBOW follows word2vec and gensim (``cbow_mean=1``): the forward pass averages the context vectors, and each
context vector receives the whole gradient of that mean, not 1/count of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.models.word2vec.config import Word2VecConfig

MAX_STEP = 1.0
"""The largest lr x curvature a word's step may have (see :func:`damp_rows`)."""
MAX_SCORE = 6.0
"""Scores beyond +-6 give no update: gensim skips such terms (word2vec's MAX_EXP), where sigma is flat."""


@dataclass
class Word2VecBatch:
    """Training rows for negative sampling; P rows, C context words, B blocks of ``block`` rows.

    Row p predicts ``centers[p]`` from the mean of the input vectors of ``contexts[owner == p]`` (one
    context per row for skip-gram). The rows of block b (rows b*block .. b*block+block-1; the last block
    is padded) share the K negative words ``negatives[b]``; ``negative_mask`` is False for padding and for
    a negative that happens to be the row's own centre word (word2vec skips those too).
    """

    contexts: Tensor  # (C,) word ids whose input vectors are averaged
    owner: Tensor  # (C,) the row each context word belongs to
    centers: Tensor  # (P,) the word each row predicts
    negatives: Tensor  # (B, K) negative words, shared by the rows of a block
    negative_mask: Tensor  # (B, block, K) bool
    n_words: int  # corpus words this batch was made from (before subsampling)

    @property
    def n_rows(self) -> int:
        return int(self.centers.shape[0])

    def to(self, device: torch.device | str) -> Word2VecBatch:
        move = {name: getattr(self, name).to(device, non_blocking=True) for name in self._tensor_names()}
        return Word2VecBatch(**move, n_words=self.n_words)

    @staticmethod
    def _tensor_names() -> tuple[str, ...]:
        return ("contexts", "owner", "centers", "negatives", "negative_mask")


def skip_saturated(scores: Tensor) -> Tensor:
    """``scores`` unchanged, but those beyond +-:data:`MAX_SCORE` pass no gradient back (gensim's rule)."""
    return torch.where(scores.abs() < MAX_SCORE, scores, scores.detach())


def damping(curvature: Tensor, lr: float) -> Tensor:
    """Each word's step factor (V,): min(1, 1 / (lr * curvature[word])).

    ``curvature`` (V,) bounds how sharply the batch's loss bends along each word's vector (the trace of its
    Hessian, sum_i sigma'(f_i) |x_i|^2 over the rows that use the word). A gradient step of size lr cannot
    overshoot that word's own minimum while lr * curvature <= 1, which holds for almost every word, whose
    update is then exactly word2vec's; only a word used by many rows at once is slowed to that limit."""
    return MAX_STEP / (lr * curvature).clamp(min=MAX_STEP)


def damp_rows(vectors: Tensor, rows: Tensor, curvature: Tensor, lr: float | None) -> Tensor:
    """``vectors`` gathered for word ids ``rows``; in the backward pass each word's gradient is scaled by
    :func:`damping`. The forward values are unchanged."""
    if lr is None or not vectors.requires_grad:
        return vectors
    scale = damping(curvature, lr)[rows].unsqueeze(-1)  # (..., 1)
    vectors.register_hook(lambda grad: grad * scale)
    return vectors


def squared_norms(vectors: Tensor) -> Tensor:
    """|x|^2 of each vector along the last dimension (one pass, no squared copy)."""
    return torch.linalg.vector_norm(vectors.detach(), dim=-1).square_()


class Word2Vec(nn.Module):
    """Input vectors W_E (the word vectors) and output vectors, trained by negative sampling."""

    def __init__(self, config: Word2VecConfig) -> None:
        super().__init__()
        self.config = config
        # sparse=True: a batch touches a few thousand rows, so the gradient holds only those rows.
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model, sparse=True)  # W_E, v_w
        self.output_embedding = nn.Embedding(config.vocab_size, config.d_model, sparse=True)  # v'_w
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """word2vec's start: input vectors uniform in [-0.5/d, 0.5/d), output vectors zero."""
        d = self.config.d_model
        with torch.no_grad():
            self.token_embedding.weight.uniform_(-0.5 / d, 0.5 / d)
            self.output_embedding.weight.zero_()

    def forward(self, ids: Tensor) -> Tensor:
        """The word vectors of ``ids`` (...,) -> (..., d_model): rows of W_E."""
        return self.token_embedding(ids)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def loss(self, batch: Word2VecBatch, lr: float | None = None) -> Tensor:
        """The negative-sampling loss summed over the batch's rows (a 0-dim tensor). With the learning rate
        ``lr`` the step of each word is kept from overshooting (:func:`damp_rows`); None: the plain gradient."""
        n_rows = batch.n_rows
        n_blocks, block = batch.negative_mask.shape[:2]
        context = self.token_embedding(batch.contexts)  # (C, d)
        if batch.contexts.shape[0] == n_rows:  # skip-gram: one context word per row, owner = arange(P)
            h = context
        else:  # CBOW: the mean; each context vector gets the whole gradient of it
            summed = context.new_zeros(n_rows, context.shape[1]).index_add(0, batch.owner, context)  # (P, d)
            count = torch.bincount(batch.owner, minlength=n_rows).clamp(min=1).unsqueeze(1)  # (P, 1)
            h = summed + (summed / count - summed).detach()
        positive = self.output_embedding(batch.centers)  # (P, d) v'_w
        negative = self.output_embedding(batch.negatives)  # (B, K, d) v'_n
        positive_scores = (h * positive).sum(-1)  # (P,) v'_w . h
        padded = F.pad(h, (0, 0, 0, n_blocks * block - n_rows)).view(n_blocks, block, -1)  # (B, block, d)
        negative_scores = torch.bmm(padded, negative.transpose(1, 2))  # (B, block, K) v'_n . h
        if lr is not None and self.training:
            self._damp(batch, context, positive, negative, positive_scores, negative_scores, padded, lr)
        positive_scores, negative_scores = skip_saturated(positive_scores), skip_saturated(negative_scores)
        loss = -F.logsigmoid(positive_scores).sum()
        return loss - F.logsigmoid(-negative_scores).masked_fill(~batch.negative_mask, 0.0).sum()

    @torch.no_grad()
    def curvatures(
        self, batch: Word2VecBatch, slope_pos: Tensor, slope_neg: Tensor, positive: Tensor, negative: Tensor, h: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The batch's curvature along each input vector and each output vector, two (V,) tensors.

        ``slope_pos`` (P,) and ``slope_neg`` (B, block, K) are sigma'(f) of every term (0 where masked),
        ``positive`` (P, d), ``negative`` (B, K, d) and ``h`` (B, block, d) the vectors of the batch."""
        vocab, n_rows = self.config.vocab_size, batch.n_rows
        # input side: each row's terms bend along h by sigma'(f) |v'|^2
        row = slope_pos * squared_norms(positive)  # (P,)
        row += (slope_neg * squared_norms(negative).unsqueeze(1)).sum(-1).flatten()[:n_rows]
        curvature_in = torch.bincount(batch.contexts, weights=row.index_select(0, batch.owner), minlength=vocab)
        # output side: the true word's term bends along v'_w by sigma'(f) |h|^2, each negative's likewise
        h_square = squared_norms(h)  # (B, block)
        curvature_out = torch.bincount(batch.centers, weights=slope_pos * h_square.flatten()[:n_rows], minlength=vocab)
        curvature_out += torch.bincount(
            batch.negatives.flatten(), weights=(slope_neg * h_square.unsqueeze(-1)).sum(1).flatten(), minlength=vocab
        )
        return curvature_in, curvature_out

    @torch.no_grad()
    def _damp(self, batch, context, positive, negative, positive_scores, negative_scores, padded, lr) -> None:
        """Register :func:`damp_rows` on the gathered input and output vectors, from this batch's curvature."""
        slope_pos = torch.sigmoid(positive_scores) * torch.sigmoid(-positive_scores)  # (P,) sigma'(f)
        slope_neg = torch.sigmoid(negative_scores) * torch.sigmoid(-negative_scores) * batch.negative_mask
        curvature_in, curvature_out = self.curvatures(batch, slope_pos, slope_neg, positive, negative, padded)
        damp_rows(context, batch.contexts, curvature_in, lr)
        damp_rows(positive, batch.centers, curvature_out, lr)
        damp_rows(negative, batch.negatives, curvature_out, lr)

    @torch.no_grad()
    def sgd_step(self, batch: Word2VecBatch, lr: float) -> Tensor:
        """One damped SGD step on the batch's summed loss, w <- w - lr * grad, with the gradient written out:
        what ``loss(batch, lr).backward()`` and plain SGD do, without autograd's intermediate tensors or
        sparse gradients (about half the time). Returns the summed loss before the step.

        With g = dloss/df for each score f (sigma(f) - 1 for the true word, sigma(f) for a negative, 0 beyond
        +-MAX_SCORE): dloss/dh = sum g v', dloss/dv' = g h, and each context vector of h gets all of
        dloss/dh (word2vec's CBOW)."""
        w_in, w_out = self.token_embedding.weight, self.output_embedding.weight
        n_rows, d = batch.n_rows, w_in.shape[1]
        n_blocks, block = batch.negative_mask.shape[:2]
        context = F.embedding(batch.contexts, w_in)  # (C, d)
        skipgram = batch.contexts.shape[0] == n_rows
        if skipgram:
            h = context
        else:
            count = torch.bincount(batch.owner, minlength=n_rows).clamp_(min=1).unsqueeze(1)
            h = context.new_zeros(n_rows, d).index_add_(0, batch.owner, context).div_(count)
        positive = F.embedding(batch.centers, w_out)  # (P, d)
        negative = F.embedding(batch.negatives, w_out)  # (B, K, d)
        padded = F.pad(h, (0, 0, 0, n_blocks * block - n_rows)).view(n_blocks, block, d)
        positive_scores = (h * positive).sum(-1)  # (P,)
        negative_scores = torch.bmm(padded, negative.transpose(1, 2))  # (B, block, K)
        loss = F.softplus(-positive_scores).sum() + (F.softplus(negative_scores) * batch.negative_mask).sum()
        sig_pos, sig_neg = torch.sigmoid(positive_scores), torch.sigmoid(negative_scores)
        g_pos = (sig_pos - 1) * (positive_scores.abs() < MAX_SCORE)
        g_neg = sig_neg * (batch.negative_mask & (negative_scores.abs() < MAX_SCORE))
        slope_pos, slope_neg = sig_pos * (1 - sig_pos), sig_neg * (1 - sig_neg) * batch.negative_mask
        curvature_in, curvature_out = self.curvatures(batch, slope_pos, slope_neg, positive, negative, padded)
        # -lr x each word's damping: the minus sign goes here because index_add_ with alpha is slower
        step_in, step_out = damping(curvature_in, lr).mul_(-lr), damping(curvature_out, lr).mul_(-lr)
        grad_h = torch.bmm(g_neg, negative).view(-1, d)[:n_rows].addcmul_(g_pos.unsqueeze(1), positive)  # (P, d)
        grad_context = grad_h if skipgram else F.embedding(batch.owner, grad_h)  # (C, d)
        grad_context.mul_(F.embedding(batch.contexts, step_in.unsqueeze(1)))
        grad_positive = h * (g_pos * step_out.index_select(0, batch.centers)).unsqueeze(1)  # (P, d)
        grad_negative = torch.bmm(g_neg.transpose(1, 2), padded)  # (B, K, d)
        grad_negative.mul_(step_out.index_select(0, batch.negatives.flatten()).view(n_blocks, -1, 1))
        w_in.index_add_(0, batch.contexts, grad_context)
        w_out.index_add_(0, batch.centers, grad_positive)
        w_out.index_add_(0, batch.negatives.flatten(), grad_negative.view(-1, d))
        return loss
