"""Decoding: from the next-token logits to text (sampling settings, the decoding engine, generation, beam search).

>>> from qkv.decoding import generate
>>> out = generate(model, [5, 17, 42], max_new_tokens=20, temperature=0.8, top_p=0.9)  # doctest: +SKIP
"""

from qkv.decoding.beam_search import Hypothesis, beam_search, greedy_decode, translate_batch
from qkv.decoding.engine import Engine
from qkv.decoding.generate import TextStreamer, generate, stream
from qkv.decoding.request import Request, TokenOutput
from qkv.decoding.sampling import (
    min_p_filter,
    penalize,
    sample_next,
    sampling_distribution,
    top_k_filter,
    top_p_filter,
)
from qkv.decoding.sampling_params import SamplingParams

__all__ = [
    "Engine",
    "Hypothesis",
    "Request",
    "SamplingParams",
    "TextStreamer",
    "TokenOutput",
    "beam_search",
    "generate",
    "greedy_decode",
    "min_p_filter",
    "penalize",
    "sample_next",
    "sampling_distribution",
    "stream",
    "top_k_filter",
    "top_p_filter",
    "translate_batch",
]
