"""Word2Vec's negative-sampling loss: its gradient is word2vec's per-row SGD update, written out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.models import Word2Vec, Word2VecConfig
from qkv.models.word2vec import Word2VecBatch


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def make_batch(contexts, owner, centers, negatives, block) -> Word2VecBatch:
    centers_t = torch.tensor(centers)
    negatives_t = torch.tensor(negatives)
    padded = torch.full((negatives_t.shape[0] * block,), -1)
    padded[: len(centers)] = centers_t
    padded = padded.view(-1, block, 1)
    mask = (negatives_t[:, None, :] != padded) & (padded >= 0)
    return Word2VecBatch(
        torch.tensor(contexts), torch.tensor(owner), centers_t, negatives_t, mask, n_words=len(centers)
    )


def reference_updates(model: Word2Vec, batch: Word2VecBatch, cbow: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What word2vec adds to W_E and to the output vectors for every row (lr = 1), row by row, from the
    same starting weights (gensim's fast_sentence_sg_neg / fast_sentence_cbow_neg with cbow_mean=1)."""
    w_in = model.token_embedding.weight.detach().double()
    w_out = model.output_embedding.weight.detach().double()
    d_in, d_out = torch.zeros_like(w_in), torch.zeros_like(w_out)
    block = batch.negative_mask.shape[1]
    for p, centre in enumerate(batch.centers.tolist()):
        context = [c for c, o in zip(batch.contexts.tolist(), batch.owner.tolist(), strict=True) if o == p]
        h = w_in[context].mean(0)
        work = torch.zeros_like(h)
        targets = [(centre, 1.0)] + [
            (n, 0.0)
            for k, n in enumerate(batch.negatives[p // block].tolist())
            if batch.negative_mask[p // block, p % block, k]
        ]
        for word, label in targets:
            g = label - sigmoid(float(h @ w_out[word]))
            work += g * w_out[word]
            d_out[word] += g * h
        for c in context:  # CBOW: every context word gets the whole error, not 1/count of it
            d_in[c] += work
    return d_in, d_out


@pytest.mark.parametrize("cbow", [False, True])
def test_gradient_is_the_word2vec_update(cbow: bool) -> None:
    model = Word2Vec(Word2VecConfig(vocab_size=12, d_model=6))
    with torch.no_grad():  # random output vectors, so every term of the update is non-zero
        model.output_embedding.weight.normal_(0, 0.5)
        model.token_embedding.weight.normal_(0, 0.5)
    if cbow:  # three rows, with 2, 3 and 1 context words
        batch = make_batch([1, 2, 3, 4, 1, 5], [0, 0, 1, 1, 1, 2], [6, 7, 6], [[8, 9, 6], [10, 11, 4]], block=2)
    else:  # skip-gram: one context word per row; word 6 is also drawn as a negative of its own row
        batch = make_batch([1, 2, 3], [0, 1, 2], [6, 7, 6], [[8, 9, 6], [10, 11, 4]], block=2)
    model.loss(batch).backward()
    d_in, d_out = reference_updates(model, batch, cbow)
    torch.testing.assert_close(-model.token_embedding.weight.grad.to_dense().double(), d_in, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(-model.output_embedding.weight.grad.to_dense().double(), d_out, atol=1e-6, rtol=1e-5)


def test_damping_shortens_only_the_steps_that_would_overshoot() -> None:
    model = Word2Vec(Word2VecConfig(vocab_size=10, d_model=4))
    with torch.no_grad():
        model.output_embedding.weight.normal_(0, 2.0)
        model.token_embedding.weight.normal_(0, 0.5)
    # word 1 is the context of 6 rows, word 2 of one row; one block of 7 rows, no negatives kept
    batch = make_batch([1, 1, 1, 1, 1, 1, 2], list(range(7)), [3, 4, 5, 6, 7, 8, 9], [[0]], block=7)
    batch.negative_mask[:] = False
    model.loss(batch).backward()
    full = model.token_embedding.weight.grad.to_dense().clone()
    w_in, w_out = model.token_embedding.weight.detach(), model.output_embedding.weight.detach()
    curvature = {1: 0.0, 2: 0.0}  # sum over the word's rows of sigma'(f) |v'_w|^2
    for c, w in zip(batch.contexts.tolist(), batch.centers.tolist(), strict=True):
        f = float(w_in[c] @ w_out[w])
        curvature[c] += sigmoid(f) * (1 - sigmoid(f)) * float(w_out[w] @ w_out[w])
    lr = 2.0 / curvature[1]
    assert lr * curvature[2] < 1  # word 2's step is safe: it must stay the plain SGD step
    model.zero_grad()
    model.loss(batch, lr=lr).backward()
    damped = model.token_embedding.weight.grad.to_dense()
    torch.testing.assert_close(damped[1], full[1] / 2)
    torch.testing.assert_close(damped[2], full[2])
    with torch.no_grad():  # evaluation never damps (nothing is updated)
        model.eval()
        assert torch.equal(model.loss(batch, lr=lr), model.loss(batch))


def test_starts_like_word2vec_and_forward_reads_w_e() -> None:
    model = Word2Vec(Word2VecConfig(vocab_size=50, d_model=10))
    weight = model.token_embedding.weight
    assert weight.abs().max() <= 0.5 / 10 and weight.std() > 0.01
    assert not model.output_embedding.weight.any()
    ids = torch.tensor([[3, 4], [5, 6]])
    assert torch.equal(model(ids), weight[ids])
    assert model.num_parameters() == 2 * 50 * 10


@pytest.mark.parametrize("cbow", [False, True])
@pytest.mark.parametrize("lr", [0.05, 3.0])  # 3.0: some words' steps are damped
def test_sgd_step_equals_autograd_and_sgd(cbow: bool, lr: float) -> None:
    torch.manual_seed(0)
    reference, fused = Word2Vec(Word2VecConfig(vocab_size=30, d_model=8)), Word2Vec(Word2VecConfig(30, 8))
    with torch.no_grad():
        reference.output_embedding.weight.normal_(0, 1.0)
        reference.token_embedding.weight.normal_(0, 1.0)
        reference.output_embedding.weight[29] = 10.0  # scores beyond +-6 pass no gradient
    fused.load_state_dict(reference.state_dict())
    start = reference.token_embedding.weight.detach().clone()
    generator = torch.Generator().manual_seed(1)
    n_rows, block = 37, 4
    n_blocks = -(-n_rows // block)
    owner = torch.arange(n_rows) if not cbow else torch.randint(0, n_rows, (90,), generator=generator).sort().values
    owner = owner if not cbow else torch.cat([torch.arange(n_rows), owner]).sort().values  # every row has one
    contexts = torch.randint(0, 30, (owner.shape[0],), generator=generator)
    centers = torch.randint(0, 30, (n_rows,), generator=generator)
    negatives = torch.randint(0, 30, (n_blocks, 3), generator=generator)
    batch = make_batch(contexts.tolist(), owner.tolist(), centers.tolist(), negatives.tolist(), block)
    loss = reference.loss(batch, lr=lr)
    loss.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(p.grad, alpha=-lr)
    fused_loss = fused.sgd_step(batch, lr)
    torch.testing.assert_close(fused_loss, loss.detach())
    for ours, theirs in zip(fused.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert (fused.token_embedding.weight - start).abs().max() > 1e-2  # the step moved the vectors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cbow", [False, True])
def test_sgd_step_on_cuda_equals_the_cpu(cbow: bool) -> None:
    torch.manual_seed(0)
    cpu = Word2Vec(Word2VecConfig(vocab_size=30, d_model=8))
    with torch.no_grad():
        cpu.output_embedding.weight.normal_(0, 1.0)
    gpu = Word2Vec(Word2VecConfig(vocab_size=30, d_model=8)).cuda()
    gpu.load_state_dict(cpu.state_dict())
    owner = [0, 0, 1, 1, 1, 2] if cbow else [0, 1, 2]
    contexts = [1, 2, 3, 4, 1, 5] if cbow else [1, 2, 3]
    batch = make_batch(contexts, owner, [6, 7, 6], [[8, 9, 6], [10, 11, 4]], block=2)
    torch.testing.assert_close(gpu.sgd_step(batch.to("cuda"), 0.5).cpu(), cpu.sgd_step(batch, 0.5))
    for ours, theirs in zip(gpu.parameters(), cpu.parameters(), strict=True):
        torch.testing.assert_close(ours.cpu(), theirs, atol=1e-5, rtol=1e-5)
