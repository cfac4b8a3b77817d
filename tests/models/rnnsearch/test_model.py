"""RNNSearch (Bahdanau et al. 2015): the paper's equations against torch's GRU cell, its attention, the
decoding interface it shares with the Transformer, saving, and the copy task learnt in seconds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.decoding.beam_search import beam_search, greedy_decode
from qkv.errors import QkvError
from qkv.layers.capture import capture
from qkv.model_dir import load_model_dir, save_model_dir
from qkv.models import RNNSearch, RNNSearchConfig, make_config
from qkv.models.config import ModelConfig
from qkv.tokenizers import CharTokenizer

PAD, BOS, EOS, VOCAB = 0, 1, 2, 11

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**changes) -> RNNSearch:
    fields = dict(
        src_vocab_size=VOCAB,
        tgt_vocab_size=VOCAB,
        d_embedding=16,
        d_hidden=12,
        d_attention=10,
        d_readout=16,
        context_length=24,
    )
    return RNNSearch(RNNSearchConfig(**{**fields, **changes}))


def padded_batch(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random source ids (B, S) of the given lengths, right-padded, and their padding mask."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, VOCAB, (len(lengths), width), generator=gen)
    mask = torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None]
    return ids.masked_fill(mask, PAD), mask


def test_decoder_follows_the_papers_equations_with_torch_gru_cell() -> None:
    """An independent loop: s_0 = tanh(W_s h<-_1), c_i by additive attention over h_j with s_{i-1}, then
    torch.nn.GRUCell on [E y_{i-1}; c_i], then maxout(U_o s_i + V_o E y_{i-1} + C_o c_i) and W_o."""
    model = tiny().double().eval()
    src, mask = padded_batch([5, 3])
    tgt = torch.randint(3, VOCAB, (2, 4))
    with torch.no_grad():
        h = model.encode(src, src_padding_mask=mask)  # (B, S, 2n)
        n = h.shape[-1] // 2
        decoder = model.decoder
        state = torch.tanh(decoder.init_state(h[:, 0, n:]))
        logits = []
        for i in range(tgt.shape[1]):
            y = model.tgt_embedding.token_embedding(tgt[:, i])  # (B, m)
            context, _ = decoder.attention(state[:, None], h, h, mask)  # the layer's own path, keys projected here
            context = context[:, 0]
            state = decoder.cell(torch.cat([y, context], dim=-1), state)  # torch's GRU cell
            t = model.readout(torch.cat([state, y, context], dim=-1))
            logits.append(t @ model.tgt_embedding.token_embedding.weight.T)  # tied W_o
        expected = torch.stack(logits, dim=1)
        torch.testing.assert_close(model(src, tgt, src_padding_mask=mask), expected, atol=1e-12, rtol=0)


def test_alignment_rows_sum_to_one_and_padding_gets_zero() -> None:
    model = tiny().eval()
    src, mask = padded_batch([6, 2, 4])
    tgt = torch.randint(3, VOCAB, (3, 5))
    with torch.no_grad(), capture(model) as acts:
        model(src, tgt, src_padding_mask=mask)
    weights = acts["decoder.attention.weights"]  # (B, 1 head, T, S): every step, recorded as cross-attention is
    assert weights.shape == (3, 1, 5, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 1, 5))
    assert (weights >= 0).all()
    assert (weights.masked_select(mask[:, None, None, :].expand_as(weights)) == 0).all()
    assert (weights.masked_select(~mask[:, None, None, :].expand_as(weights)) > 0).all()


def test_padding_changes_nothing_for_a_sentence() -> None:
    model = tiny().eval()
    src, mask = padded_batch([6, 3])
    tgt = torch.randint(3, VOCAB, (2, 4))
    with torch.no_grad():
        batched = model(src, tgt, src_padding_mask=mask)
        alone = model(src[1:, :3], tgt[1:])
    torch.testing.assert_close(batched[1:], alone, atol=1e-6, rtol=0)


def test_cached_decoding_equals_teacher_forcing_and_the_cache_reorders_and_resets() -> None:
    model = tiny(dropout=0.3).eval()
    src, mask = padded_batch([4, 6, 5])
    tgt = torch.randint(3, VOCAB, (3, 6))
    with torch.no_grad():
        full = model(src, tgt, src_padding_mask=mask)
        memory = model.encode(src, src_padding_mask=mask)
        cache = model.new_cache()
        first = model.decode(tgt[:, :2], memory, memory_padding_mask=mask, cache=cache)  # a prefix of 2 at once
        steps = [model.decode(tgt[:, i : i + 1], memory, memory_padding_mask=mask, cache=cache) for i in range(2, 6)]
        assert cache.length == 6
        torch.testing.assert_close(torch.cat([first, *steps], dim=1), full, atol=1e-6, rtol=0)
        last = model.decode(tgt[:, :3], memory, memory_padding_mask=mask, cache=model.new_cache(), last_only=True)
        torch.testing.assert_close(last, full[:, 2:3], atol=1e-6, rtol=0)

        order = torch.tensor([2, 0, 1])
        cache = model.new_cache()
        model.decode(tgt[:, :3], memory, memory_padding_mask=mask, cache=cache)
        cache.reorder(order)  # each row now continues another sentence's decoding
        after = model.decode(tgt[order, 3:4], memory[order], memory_padding_mask=mask[order], cache=cache)
        torch.testing.assert_close(after, full[order, 3:4], atol=1e-6, rtol=0)

        cache.reset()
        again = model.decode(tgt[order, :1], memory[order], memory_padding_mask=mask[order], cache=cache)
        torch.testing.assert_close(again, full[order, :1], atol=1e-6, rtol=0)
        with pytest.raises(QkvError, match="context"):
            model.decode(torch.full((3, 25), 3), memory, memory_padding_mask=mask)


def copy_batch(n: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """The copy task: the target is the source. Sources of 2-6 symbols, right-padded."""
    lengths = torch.randint(2, 7, (n,), generator=gen)
    src, mask = padded_batch(lengths.tolist(), seed=int(torch.randint(1 << 30, (1,), generator=gen)))
    tgt = torch.full((n, src.shape[1] + 2), PAD)
    tgt[:, 0] = BOS
    for i, length in enumerate(lengths.tolist()):
        tgt[i, 1 : length + 1] = src[i, :length]
        tgt[i, length + 1] = EOS
    return src, mask, tgt, lengths


@pytest.fixture(scope="module")
def copier(one_thread) -> RNNSearch:
    """An RNNSearch trained on the copy task for a few seconds (AdamW, 120 steps of 32 sentences)."""
    torch.manual_seed(0)
    model = tiny(d_embedding=32, d_hidden=32, d_attention=32, d_readout=32, share_embeddings=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    for _ in range(120):
        src, mask, tgt, _ = copy_batch(32, gen)
        logits = model(src, tgt[:, :-1], src_padding_mask=mask)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def test_rnnsearch_learns_the_copy_task(copier) -> None:
    src, mask, _, lengths = copy_batch(200, torch.Generator().manual_seed(99))
    out = greedy_decode(copier, src, mask, bos_id=BOS, eos_id=EOS)
    exact = sum(o == s[:n].tolist() for o, s, n in zip(out, src, lengths.tolist(), strict=True)) / len(out)
    assert exact >= 0.9
    with torch.no_grad(), capture(copier) as acts:  # copying aligns target token i with source token i
        copier(src[:50], torch.cat([torch.full((50, 1), BOS), src[:50]], dim=1), src_padding_mask=mask[:50])
    weights = acts["decoder.attention.weights"][:, 0, :-1]  # (50, S, S): row i predicts target token i
    diagonal = torch.diagonal(weights, dim1=1, dim2=2)[~mask[:50]]
    assert diagonal.mean() > 0.5


def test_beam_search_with_beam_1_equals_greedy(copier) -> None:
    for model in (copier, tiny().eval()):  # trained, and random (long, uncertain outputs)
        src, mask, _, _ = copy_batch(12, torch.Generator().manual_seed(5))
        greedy = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS)
        beam = beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, beam_size=1)
        assert [hyps[0].tokens for hyps in beam] == greedy
    wide = beam_search(copier, src, mask, bos_id=BOS, eos_id=EOS, beam_size=4, n_best=4)
    assert all(
        len(hyps) == 4 and [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True) for hyps in wide
    )


def test_save_and_load_round_trip(tmp_path) -> None:
    tokenizer = CharTokenizer.train("abcdefgh")
    config = RNNSearchConfig(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size,
                             d_embedding=8, d_hidden=6, d_attention=4, d_readout=5, tie_embeddings=False,
                             share_embeddings=True)  # fmt: skip
    model = RNNSearch(config).eval()
    save_model_dir(tmp_path / "run", model, tokenizer)
    bundle = load_model_dir(tmp_path / "run")
    assert isinstance(bundle.model, RNNSearch) and bundle.config == config
    assert ModelConfig.load(tmp_path / "run" / "config.json") == config
    src, mask = padded_batch([4, 2])
    src = src % tokenizer.vocab_size
    tgt = torch.randint(0, tokenizer.vocab_size, (2, 3))
    with torch.no_grad():
        torch.testing.assert_close(
            bundle.model(src, tgt, src_padding_mask=mask), model(src, tgt, src_padding_mask=mask), atol=0, rtol=0
        )
    shared = bundle.model.src_embedding.token_embedding.weight
    assert bundle.model.tgt_embedding.token_embedding.weight is shared  # still one matrix after loading


def test_config_checks_and_presets() -> None:
    with pytest.raises(QkvError, match="d_readout=10 must equal d_embedding=16"):
        RNNSearchConfig(d_embedding=16, d_readout=10)
    with pytest.raises(QkvError, match="share_embeddings needs one vocabulary"):
        RNNSearchConfig(src_vocab_size=10, tgt_vocab_size=12, share_embeddings=True)
    with pytest.raises(QkvError, match="dropout"):
        RNNSearchConfig(dropout=1.0)
    with pytest.raises(QkvError, match="rnnsearch model has no n_heads"):
        make_config("rnnsearch-small", n_heads=4)
    paper = make_config("rnnsearch-50")
    assert (paper.d_embedding, paper.d_hidden, paper.d_attention, paper.d_readout) == (620, 1000, 1000, 500)
    assert paper.to_dict()["model"] == "rnnsearch" and ModelConfig.from_dict(paper.to_dict()) == paper
    small = RNNSearch(make_config("rnnsearch-small", src_vocab_size=100, tgt_vocab_size=100))
    assert small.unembedding.weight is small.tgt_embedding.token_embedding.weight  # tied W_o
    assert small.num_parameters() == sum(p.numel() for p in small.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_it_matches_the_cpu_and_trains_under_bf16_autocast() -> None:
    model = tiny().double().eval()  # float64: no near-tie between logits can flip a greedy choice
    src, mask = padded_batch([6, 3, 5])
    tgt = torch.randint(3, VOCAB, (3, 4))
    with torch.no_grad():
        expected = model(src, tgt, src_padding_mask=mask)
        cpu_greedy = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, max_len=8)
    model.cuda()
    src, mask, tgt = src.cuda(), mask.cuda(), tgt.cuda()
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt, src_padding_mask=mask).cpu(), expected, atol=1e-9, rtol=0)
        assert greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, max_len=8) == cpu_greedy
    model.float().train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(src, tgt, src_padding_mask=mask)
    torch.testing.assert_close(logits.float().cpu(), expected.float(), atol=0.1, rtol=0.1)
    logits.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
