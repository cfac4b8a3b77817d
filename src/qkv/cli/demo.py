"""Show one attention head at work on seed 004's example, "The quick brown fox jumps", step by step."""

from __future__ import annotations

import argparse

import torch

from qkv.layers.attention import attention_scores, causal_mask, masked_softmax

HELP = "print scaled dot-product attention step by step on a worked example"

TOKENS = ["The", "quick", "brown", "fox", "jumps"]
# Seed 004's simplified queries, keys and values (d_k = 2).
Q = [[0.1, 0.2], [0.5, 0.6], [0.9, 1.0], [1.3, 1.4], [1.7, 1.8]]
K = [[0.2, 0.1], [0.6, 0.5], [1.0, 0.9], [1.4, 1.3], [1.8, 1.7]]
V = [[0.3, 0.4], [0.7, 0.8], [1.1, 1.2], [1.5, 1.6], [1.9, 2.0]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--causal", action="store_true", help="hide later tokens (decoder self-attention)")


def _row(label: str, values: torch.Tensor) -> str:
    return f"  {label:>7} " + " ".join(f"{v:8.4f}" for v in values.tolist())


def run(args: argparse.Namespace) -> int:
    q, k, v = torch.tensor(Q), torch.tensor(K), torch.tensor(V)
    print("Tokens:", " ".join(TOKENS), "\n")
    for name, matrix in (("Q", q), ("K", k), ("V", v)):
        print(f"{name} (one row per token):")
        for token, row in zip(TOKENS, matrix, strict=True):
            print(_row(token, row))
    scores = attention_scores(q, k)
    scaled = scores / k.shape[-1] ** 0.5
    mask = causal_mask(len(TOKENS)) if args.causal else None
    weights = masked_softmax(scaled, mask)
    softmax_title = "Softmax of each row" + (
        " after the causal mask (-inf above the diagonal):" if args.causal else ":"
    )
    steps = [
        ("Scores Q K^T (dot product of each query with each key):", scores),
        (f"Scaled by 1/sqrt(d_k) = 1/sqrt({k.shape[-1]}):", scaled),
        (softmax_title, weights),
        ("Output = weights x V (a weighted sum of the values):", weights @ v),
    ]
    for title, matrix in steps:
        print(f"\n{title}")
        for token, row in zip(TOKENS, matrix, strict=True):
            print(_row(token, row))
    return 0
