"""The fixed-shape decode step computes the model's own logits, position by position, for every kind of
GPT and encoder-decoder qkv builds (positions, LN placement, biases, tied or separate unembedding), with the
mask over the whole static cache or with the filled positions only, and for beams sharing their sentence's
encoder keys."""

from __future__ import annotations

import pytest
import torch

from qkv import GPT, GPTConfig
from qkv.decoding.decode_step import cross_attention_keys, decoder_blocks, gpt_step, transformer_step
from qkv.layers.blocks import DecoderBlock
from qkv.layers.fused import fuse_linears
from qkv.models import Transformer, TransformerConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread is fastest (tests/conftest.py)


VARIANTS = [
    dict(positional="learned"),
    dict(positional="rope", norm_first=False),
    dict(positional="sinusoidal", bias=False, tie_embeddings=False),
    dict(positional="none", scale_embeddings=True, activation="relu"),
]


def _projections(model) -> list[torch.nn.Module]:
    return [fuse_linears(b.self_attn.query, b.self_attn.key, b.self_attn.value) for b in model.decoder.blocks]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("pool", [False, True])  # the layers' caches as views, or the pool written through itself
def test_gpt_step_gives_the_forward_logits_at_every_position(variant: dict, masked: bool, pool: bool) -> None:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=40, d_model=32, n_heads=4, n_layers=2, context_length=24, init_std=0.3, **variant)
    model = GPT(config).double().eval()
    ids = torch.randint(40, (3, 12))
    with torch.no_grad():
        expected = model(ids)  # (B, T, V)
        cache = model.new_cache(16)
        buffer = cache.allocate(3, 4, 8, dtype=torch.float64, device=torch.device("cpu"))
        projections, kv = _projections(model), buffer if pool else buffer.unbind(0)
        for t in range(12):
            n_keys = None if masked else t + 1
            logits = gpt_step(model, projections, ids[:, t], torch.tensor([t]), kv, n_keys)  # (B, V)
            torch.testing.assert_close(logits, expected[:, t], atol=1e-10, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS[:3])
@pytest.mark.parametrize(("group", "masked"), [(1, False), (3, False), (3, True)])
@pytest.mark.parametrize("pool", [False, True])
def test_transformer_step_gives_the_decoder_logits_with_beams_sharing_their_source(
    variant: dict, group: int, masked: bool, pool: bool
) -> None:
    torch.manual_seed(0)
    config = TransformerConfig(
        src_vocab_size=30,
        tgt_vocab_size=25,
        d_model=32,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        context_length=24,
        init_std=0.3,
        final_logits_bias=True,
        **variant,
    )
    model = Transformer(config).double().eval()
    src = torch.randint(1, 30, (2, 7))
    padding = torch.tensor([[False] * 7, [False] * 4 + [True] * 3])
    tgt = torch.randint(25, (2 * group, 9))  # each beam has its own target
    with torch.no_grad():
        memory = model.encode(src, src_padding_mask=padding)
        rows = torch.arange(2).repeat_interleave(group)  # row b * group + j reads sentence b
        expected = model.decode(tgt, memory[rows], memory_padding_mask=padding[rows])
        cross = cross_attention_keys(model, memory, padding, group=group, pad_to=16 if masked else None, fixed=masked)
        assert cross.keys[0].shape == (2, 4, 16 if masked else 7, 8)  # per sentence, not per beam
        cache = model.new_cache(12)
        buffer = cache.allocate(2 * group, 4, 8, dtype=torch.float64, device=torch.device("cpu"))
        kv = buffer if pool else buffer.unbind(0)
        projections = _projections(model)
        for t in range(9):
            n_keys = None if masked else t + 1
            logits = transformer_step(model, projections, tgt[:, t], torch.tensor([t]), kv, cross, n_keys)
            torch.testing.assert_close(logits, expected[:, t], atol=1e-10, rtol=0)


def test_a_source_with_nothing_to_attend_to_gets_zero_cross_attention_as_in_the_model() -> None:
    torch.manual_seed(0)
    config = TransformerConfig(
        src_vocab_size=30, tgt_vocab_size=25, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1
    )
    model = Transformer(config).double().eval()
    src = torch.randint(1, 30, (2, 4))
    padding = torch.tensor([[False] * 4, [True] * 4])
    tgt = torch.randint(25, (2, 3))
    with torch.no_grad():
        memory = model.encode(src, src_padding_mask=padding)
        expected = model.decode(tgt, memory, memory_padding_mask=padding)
        cross = cross_attention_keys(model, memory, padding)
        assert cross.empty is not None and cross.empty.flatten().tolist() == [False, True]
        kv = model.new_cache(4).allocate(2, 2, 8, dtype=torch.float64, device=torch.device("cpu")).unbind(0)
        for t in range(3):
            logits = transformer_step(model, _projections(model), tgt[:, t], torch.tensor([t]), kv, cross, t + 1)
            assert logits.isfinite().all()
            torch.testing.assert_close(logits, expected[:, t], atol=1e-10, rtol=0)


def _per_row_model(kind: str) -> GPT:
    torch.manual_seed(0)
    if kind == "llama":  # rotary angles per row, and a cache of n_kv_heads = 2 heads for 4 query heads
        from qkv.models import LlamaConfig
        from qkv.models.llama import Llama

        config = LlamaConfig(vocab_size=40, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=48,
                             context_length=24, init_std=0.3)  # fmt: skip
        return Llama(config).double().eval()
    variant = dict(positional="learned") if kind == "learned" else dict(positional="rope", norm_first=False)
    config = GPTConfig(vocab_size=40, d_model=32, n_heads=4, n_layers=2, context_length=24, init_std=0.3, **variant)
    return GPT(config).double().eval()


@pytest.mark.parametrize("kind", ["learned", "rope", "llama"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("pool", [False, True])
def test_a_step_with_a_position_per_row_gives_each_row_the_forward_logits_at_its_own_position(
    kind: str, masked: bool, pool: bool
) -> None:
    """Continuous batching: three texts started at different times step together, each at its own position,
    over cache rows that hold another text's leftovers past that position (which the mask must hide)."""
    model = _per_row_model(kind)
    config = model.config
    ids = torch.randint(40, (3, 14))
    starts = [5, 0, 2]  # tokens already in each row's cache when the batch begins
    with torch.no_grad():
        expected = model(ids)  # (B, T, V)
        buffer = model.new_cache(16).allocate(3, config.n_kv_heads, config.head_dim, dtype=torch.float64,
                                              device=torch.device("cpu"))  # fmt: skip
        buffer.normal_(0, 5.0)  # a previous request's keys and values, everywhere
        projections = _projections(model)
        for row, start in enumerate(starts):  # each row alone, as a prefill would leave it
            kv = buffer[:, row : row + 1].unbind(0)
            for t in range(start):
                gpt_step(model, projections, ids[row : row + 1, t], torch.tensor([t]), kv, t + 1)
        kv = buffer if pool else buffer.unbind(0)
        for step in range(8):
            position = torch.tensor([start + step for start in starts])  # (B,)
            n_keys = None if masked else int(position.max()) + 1
            logits = gpt_step(model, projections, ids[torch.arange(3), position], position, kv, n_keys)
            torch.testing.assert_close(logits, expected[torch.arange(3), position], atol=1e-10, rtol=0)


def test_decoder_blocks_are_the_stacks_own_blocks_in_order() -> None:
    model = GPT(GPTConfig(vocab_size=40, d_model=32, n_heads=4, n_layers=3, context_length=24))
    blocks = decoder_blocks(model.decoder)
    assert len(blocks) == 3 and all(isinstance(block, DecoderBlock) for block in blocks)
    assert [id(block) for block in blocks] == [id(block) for block in model.decoder.blocks]
