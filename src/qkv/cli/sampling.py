"""The sampling flags every generating verb shares (generate, chat), turned into one SamplingParams.

Each flag is a field of :class:`qkv.decoding.SamplingParams` with the same name and meaning as in OpenAI's API,
vLLM and llama.cpp; the object is checked once, when it is built, and a bad value is one line. ``--prompt-lookup
K`` is ``SamplingParams.prompt_lookup`` (:mod:`qkv.decoding.prompt_lookup`): it checks drafts against greedy
decoding, so it makes the default temperature 0, and refuses a temperature or a penalty given with it.
"""

from __future__ import annotations

import argparse

from qkv.cli.options import add_seed_argument
from qkv.errors import QkvError


def add_sampling_arguments(parser: argparse.ArgumentParser, *, temperature: float, max_new_tokens: int) -> None:
    """--max-new-tokens, --temperature, --top-k, --top-p, --min-p, the three penalties, --prompt-lookup and
    --seed."""
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens,
                        help=f"tokens to generate at most (default {max_new_tokens})")  # fmt: skip
    parser.add_argument(
        "--temperature",
        type=float,
        default=None,
        help=f"0 = greedy; higher = more varied (default {temperature}, 0 with --prompt-lookup)",
    )
    parser.set_defaults(default_temperature=temperature)
    parser.add_argument("--top-k", type=int, default=None, help="sample only among the k likeliest tokens")
    parser.add_argument("--top-p", type=float, default=None, help="sample only from the nucleus of mass p")
    parser.add_argument("--min-p", type=float, default=None,
                        help="drop tokens less likely than min-p times the likeliest (e.g. 0.05)")  # fmt: skip
    parser.add_argument("--repetition-penalty", type=float, default=1.0,
                        help="divide the logits of tokens already in the text by this (1 = none; 1.1-1.3 "
                        "discourages repeats)")  # fmt: skip
    parser.add_argument("--presence-penalty", type=float, default=0.0,
                        help="subtract this from tokens already generated (OpenAI's, -2..2; default 0)")  # fmt: skip
    parser.add_argument("--frequency-penalty", type=float, default=0.0,
                        help="subtract this per earlier occurrence of a token (OpenAI's, -2..2)")  # fmt: skip
    parser.add_argument("--prompt-lookup", type=int, default=0, metavar="K",
                        help="draft up to K tokens a step by copying what followed the text's last tokens where they "
                        "occurred before, checked in that step: the same greedy text in fewer steps when the answer "
                        "repeats its prompt (quoting, editing, code); greedy only (default 0: off)")  # fmt: skip
    add_seed_argument(parser, what="random seed: the same seed and settings give the same text")


def sampling_params(args: argparse.Namespace):
    """The flags of :func:`add_sampling_arguments` as one checked SamplingParams (QkvError on a bad value)."""
    from qkv.decoding.sampling_params import SamplingParams

    lookup = args.prompt_lookup
    temperature = args.temperature
    if temperature is None:
        temperature = 0.0 if lookup > 0 else args.default_temperature
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
    )
    breakers = params.not_greedy() if lookup > 0 else []  # SamplingParams' rule, said with the flag's name
    if breakers:
        flag, value = "--" + breakers[0][0].replace("_", "-"), breakers[0][1]
        raise QkvError(f"--prompt-lookup {lookup} checks its drafts against greedy decoding, which {flag} "
                       f"{value:g} changes: leave out {flag}, or --prompt-lookup")  # fmt: skip
    return params.replace(prompt_lookup=lookup)
