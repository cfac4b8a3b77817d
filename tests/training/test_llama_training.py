"""Training the Llama family: Muon takes its grouped and gated matrices and brings the loss down, and the
FLOPs per token count the gate's third matrix and the narrower W_k, W_v as a hand count does."""

from __future__ import annotations

import torch

from qkv.models import LlamaConfig
from qkv.models.llama import Llama
from qkv.training.flops import training_flops_per_token
from qkv.training.optim import make_optimizer
from qkv.training.tasks.language_model import next_token_loss


def tiny_llama(**kw) -> Llama:
    torch.manual_seed(0)
    config = dict(vocab_size=20, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=48, context_length=16)
    return Llama(LlamaConfig(**{**config, **kw}))


def test_muon_trains_a_llama() -> None:
    model = tiny_llama(qkv_bias=True)
    optimizer = make_optimizer(model, lr=1e-2, weight_decay=0.0, betas=(0.9, 0.99), device_type="cpu", kind="muon")
    muon = {id(p) for g in optimizer.param_groups if g["muon"] for p in g["params"]}
    block = model.decoder.blocks[0]
    for matrix in (block.self_attn.key.weight, block.feed_forward.gate.weight, block.feed_forward.linear2.weight):
        assert id(matrix) in muon
    assert id(block.self_attn.key.bias) not in muon and id(model.unembedding.weight) not in muon
    generator = torch.Generator().manual_seed(0)
    sequences = torch.stack([torch.arange(17) * step % 20 for step in torch.randint(1, 5, (8,), generator=generator)])
    x, y = sequences[:, :-1], sequences[:, 1:]  # each row counts by its own step: learnable from the context
    for group in optimizer.param_groups:  # the trainer's schedule sets the rates so, at its peak
        group["lr"] = 1e-2 * group["lr_scale"]  # Muon's: 0.02
    losses = []
    for _ in range(40):
        loss = next_token_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses[::5]


def test_flops_per_token_by_hand_for_grouped_query_attention_and_a_gated_ffn() -> None:
    model = tiny_llama()
    d, d_kv, d_ff, vocab, layers, length = 32, 2 * 8, 48, 20, 2, 16
    attention = d * d + 2 * d * d_kv + d * d  # W_q, W_k and W_v of h_kv heads, W_o
    feed_forward = 3 * d * d_ff  # W_g, W_1, W_2
    norms = 2 * d
    matmul_parameters = layers * (attention + feed_forward + norms) + d + vocab * d  # + final norm + W_U
    expected = 6 * matmul_parameters + 12 * layers * d * length  # W_E is a lookup: not counted
    assert training_flops_per_token(model) == expected
    tied = tiny_llama(tie_embeddings=True)  # W_E is W_U: counted once, as the unembedding
    assert training_flops_per_token(tied) == expected
    full = tiny_llama(n_kv_heads=4)
    assert training_flops_per_token(full) - expected == 6 * layers * 2 * d * (d - d_kv)
