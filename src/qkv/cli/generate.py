"""Generate text from a trained GPT, streaming tokens to the terminal as they are made.

Temperature 0 is greedy decoding (always the most likely token); higher temperatures flatten the
distribution; --top-k and --top-p keep only the likeliest tokens before sampling. Prompts longer than the
model's context are cropped from the left, and generation stops at <eos> if the tokenizer has one.
"""

from __future__ import annotations

import argparse
import sys

import torch

from qkv.cli.common import (
    add_device_arguments,
    add_engine_argument,
    add_model_argument,
    add_quantize_argument,
    load_for_use,
    model_path,
    note_unknown,
    use_device,
)
from qkv.cli.options import add_seed_argument, compile_note
from qkv.errors import QkvError

HELP = "generate text with a trained GPT"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser)
    parser.add_argument("--prompt", default="", help="text to continue (default: start from scratch)")
    parser.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate (default 200)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy; higher = more varied (0.8)")
    parser.add_argument("--top-k", type=int, default=None, help="sample only among the k likeliest tokens")
    parser.add_argument("--top-p", type=float, default=None, help="sample only from the nucleus of mass p")
    add_seed_argument(parser, what="random seed: the same seed and settings give the same text")
    parser.add_argument("--num-samples", type=int, default=1, help="how many samples (default 1)")
    add_device_arguments(parser)
    add_quantize_argument(parser)
    parser.add_argument("--no-cache", action="store_true", help="recompute every step instead of using the KV cache")
    add_engine_argument(parser)


def run(args: argparse.Namespace) -> int:
    from qkv.decoding import TextStreamer, stream

    if args.num_samples < 1:
        raise QkvError("--num-samples must be at least 1")
    args.device = use_device(args)
    bundle = load_for_use(model_path(args), expect="language model", device=args.device, quantize=args.quantize)
    tokenizer, model = bundle.tokenizer, bundle.model
    compile_note(args.engine)
    note_unknown(tokenizer, args.prompt, what="the prompt")
    prompt = tokenizer.encode(args.prompt) if args.prompt else []
    if not prompt:
        prompt = [tokenizer.bos_id] if tokenizer.bos_id is not None else tokenizer.encode("\n")
    generator = torch.Generator(device=use_device(args))
    generator.manual_seed(args.seed)
    warned = False

    def on_crop(dropped: int) -> None:
        nonlocal warned
        if not warned:
            print(
                f"note: the prompt is longer than the model's context of {model.config.context_length} tokens; "
                f"the first {dropped} tokens were dropped",
                file=sys.stderr,
            )
            warned = True

    for i in range(args.num_samples):
        if args.num_samples > 1:
            print(f"--- sample {i + 1} ---")
        # The prompt as the tokenizer decodes it, and the new text joined to it as the tokenizer joins tokens
        # (a word-level tokenizer puts a space between words: "Mr. Darcy is over", not "isover").
        shown = prompt if args.prompt else []
        streamer = TextStreamer(tokenizer, prompt_ids=shown)
        sys.stdout.write(tokenizer.decode(shown))
        for token in stream(
            model,
            prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            eos_id=tokenizer.eos_id,
            use_cache=not args.no_cache,
            engine=args.engine,
            generator=generator,
            on_crop=on_crop,
        ):
            sys.stdout.write(streamer.push(token))
            sys.stdout.flush()
        sys.stdout.write(streamer.flush() + "\n")
    return 0
