"""Generate text from a trained GPT, streaming tokens to the terminal as they are made.

Temperature 0 is greedy decoding (always the most likely token); higher temperatures flatten the
distribution; --top-k and --top-p keep only the likeliest tokens before sampling. Prompts longer than the
model's context are cropped from the left, and generation stops at <eos> if the tokenizer has one.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Protocol, cast

import torch

from qkv.cli.common import (
    add_device_arguments,
    add_model_argument,
    add_quantize_argument,
    add_step_argument,
    load_for_use,
    load_options,
    model_path,
    note_unknown,
    use_device,
)
from qkv.cli.held_notes import release_notes
from qkv.cli.options import compile_note, compiled_note, note
from qkv.cli.sampling import add_sampling_arguments, sampling_params
from qkv.errors import QkvError

if TYPE_CHECKING:
    from qkv.models.gpt.config import GPTConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    parser.add_argument("--prompt", default="", help="text to continue (default: start from scratch)")
    add_sampling_arguments(parser, temperature=0.8, max_new_tokens=200)
    parser.add_argument("--num-samples", type=int, default=1, help="how many samples (default 1)")
    add_device_arguments(parser)
    add_quantize_argument(parser)
    parser.add_argument("--no-cache", action="store_true", help="recompute every step instead of using the KV cache")
    add_step_argument(parser)


class _StreamedIds(Protocol):
    """What :func:`qkv.decoding.stream` returns besides ids: the prompt tokens dropped to fit the context, and the
    model's passes."""

    cropped: int
    passes: int


def run(args: argparse.Namespace) -> int:
    from qkv.decoding import TextStreamer, stream
    from qkv.decoding.prompt_lookup import check_cached

    if args.num_samples < 1:
        raise QkvError("--num-samples must be at least 1")
    params = sampling_params(args)  # checked before the model loads
    check_cached(params, use_cache=not args.no_cache)
    args.device = use_device(args)
    bundle = load_for_use(
        model_path(args),
        expect="language model",
        device=args.device,
        **load_options(args),
    )
    tokenizer, model = bundle.tokenizer, bundle.model
    release_notes()  # the input is checked: the notes held so far (qkv.cli.held_notes) come now
    compile_note(args.step)
    note_unknown(tokenizer, args.prompt, what="the prompt")
    prompt = tokenizer.encode(args.prompt) if args.prompt else []
    if not prompt:
        prompt = [tokenizer.bos_id] if tokenizer.bos_id is not None else tokenizer.encode("\n")
    generator = torch.Generator(device=args.device)
    generator.manual_seed(args.seed)
    made, passes, started = 0, 0, time.perf_counter()
    for i in range(args.num_samples):
        if args.num_samples > 1:
            print(f"--- sample {i + 1} ---")
        # The prompt as the tokenizer decodes it, and the new text joined to it as the tokenizer joins tokens
        # (a word-level tokenizer puts a space between words: "Mr. Darcy is over", not "isover").
        shown = prompt if args.prompt else []
        streamer = TextStreamer(tokenizer, prompt_ids=shown)
        tokens = stream(model, prompt, params, eos_id=tokenizer.eos_id, use_cache=not args.no_cache, step=args.step,
                        generator=generator)  # fmt: skip
        cropped = cast(_StreamedIds, tokens).cropped
        if cropped and i == 0:
            context = cast("GPTConfig", model.config).context_length
            note(f"the prompt is longer than the model's context of {context} tokens; "
                 f"the first {cropped} tokens were dropped")  # fmt: skip
        sys.stdout.write(tokenizer.decode(shown))
        for token in tokens:
            made += 1
            sys.stdout.write(streamer.push(token))
            sys.stdout.flush()
        sys.stdout.write(streamer.flush() + "\n")
        passes += cast(_StreamedIds, tokens).passes if params.prompt_lookup else 0
    seconds = time.perf_counter() - started
    drafted = f", {passes} passes of the model (--prompt-lookup)" if params.prompt_lookup else ""
    note(f"{made} tokens in {seconds:.1f} s ({made / max(seconds, 1e-9):.1f} tokens/s){drafted}")
    compiled_note(args.step, model)
    return 0
