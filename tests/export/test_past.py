"""Keys and values passed in and out (the exported graphs' cache) give the numbers of qkv's own KV cache."""

from __future__ import annotations

import torch

from qkv.export.past import PastKeyValues
from qkv.models import GPT, GPTConfig, Transformer, TransformerConfig


def empty(batch: int, n_layers: int, heads: int, head_dim: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.zeros(batch, heads, 0, head_dim), torch.zeros(batch, heads, 0, head_dim)) for _ in range(n_layers)]


def test_gpt_step_by_step_equals_the_whole_sequence() -> None:
    model = GPT(GPTConfig(vocab_size=50, d_model=32, n_heads=4, n_layers=2, context_length=24, positional="rope"))
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        whole = model(ids)
        past = empty(2, 2, 4, 8)
        pieces = []
        for chunk in (ids[:, :5], ids[:, 5:6], ids[:, 6:9]):  # a prompt, one token, three tokens
            cache = PastKeyValues(past)
            pieces.append(model(chunk, cache=cache))
            presents = cache.presents()
            past = list(zip(presents[0::2], presents[1::2], strict=True))
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=1e-5, rtol=1e-5)
    assert past[0][0].shape == (2, 4, 9, 8)


def test_translator_with_static_cross_keys_equals_teacher_forcing() -> None:
    config = TransformerConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=32, n_heads=4, n_encoder_layers=1,
                               n_decoder_layers=2, context_length=24)  # fmt: skip
    model = Transformer(config).eval()
    src, tgt = torch.randint(0, 40, (2, 7)), torch.randint(0, 40, (2, 5))
    mask = torch.zeros(2, 7, dtype=torch.bool)
    mask[1, 5:] = True
    with torch.no_grad():
        forced = model(src, tgt, src_padding_mask=mask)
        memory = model.encode(src, src_padding_mask=mask)
        cross = []
        for block in model.decoder.blocks:
            attention = block.cross_attn
            cross.append((attention.split_heads(attention.key(memory)), attention.split_heads(attention.value(memory))))
        past, steps = empty(2, 2, 4, 8), []
        for t in range(5):
            cache = PastKeyValues(past, cross)
            steps.append(model.decode(tgt[:, t : t + 1], memory, memory_padding_mask=mask, cache=cache))
            presents = cache.presents()
            past = list(zip(presents[0::2], presents[1::2], strict=True))
    torch.testing.assert_close(torch.cat(steps, dim=1), forced, atol=1e-5, rtol=1e-5)
