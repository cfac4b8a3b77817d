"""Talk to a chat model in the terminal: each line you type is a user turn, the model's answer streams back.

The conversation is rendered with the model's own chat template (from its GGUF file or its Hugging Face folder;
--chat-template FILE gives another) and the answer ends at the template's end of turn. Typed commands: /reset
forgets the conversation (the --system prompt stays), /exit (or Ctrl-D) ends it, /help lists them. When stdin is
not a terminal (a pipe or a file), every non-empty line is one user turn and only the answers are printed, one per
line, so a script can drive it: printf 'Hi!\\nAnd in French?\\n' | qkv chat model.gguf
"""

from __future__ import annotations

import argparse
import sys

import torch

from qkv.cli.common import (
    add_device_arguments,
    add_model_argument,
    add_quantize_argument,
    add_step_argument,
    load_for_use,
    model_path,
    use_device,
)
from qkv.cli.options import compile_note, note
from qkv.cli.sampling import add_sampling_arguments, sampling_params

HELP = "talk to a chat model (a .gguf file, a Hugging Face folder, or a run)"
COMMANDS = "/reset forgets the conversation, /exit ends it, /help shows this"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_argument(parser, what="the chat model: a .gguf file, a Hugging Face folder or a run directory")
    parser.add_argument("--system", default=None, metavar="TEXT", help="a system prompt that opens the conversation")
    parser.add_argument("--chat-template", default=None, metavar="FILE",
                        help="a Jinja chat template to use instead of the model's own")  # fmt: skip
    add_sampling_arguments(parser, temperature=0.7, max_new_tokens=512)
    add_device_arguments(parser)
    add_quantize_argument(parser)
    add_step_argument(parser)


def run(args: argparse.Namespace) -> int:
    from qkv.chat_templates import read_template_file
    from qkv.chat_templates.prompt import chat_prompt
    from qkv.decoding.replies import chat_stream

    params = sampling_params(args)  # checked before the model loads
    template = read_template_file(args.chat_template) if args.chat_template else None
    args.device = use_device(args)
    bundle = load_for_use(
        model_path(args),
        expect="language model",
        device=args.device,
        quantize=args.quantize,
        dequantize=args.dequantize,
    )
    opening = [{"role": "system", "content": args.system}] if args.system else []
    chat_prompt(bundle, [*opening, {"role": "user", "content": "Hi"}], template=template)  # a template, or one line
    compile_note(args.step)
    interactive = sys.stdin.isatty()
    if interactive:
        note(f"chatting with {bundle.path.name}: {COMMANDS}")
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    history = list(opening)
    for line in _turns(interactive):
        if line in ("/exit", "/quit"):
            break
        if line == "/reset":
            history = list(opening)
            note("the conversation starts again")
            continue
        if line == "/help":
            note(COMMANDS)
            continue
        history.append({"role": "user", "content": line})
        answer = chat_stream(bundle, history, params, template=template, step=args.step, generator=generator)
        if answer.reply.cropped:
            note(f"the conversation is longer than the model's context: its first {answer.reply.cropped} tokens "
                 "are not read (/reset starts again)")  # fmt: skip
        for piece in answer:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        history.append({"role": "assistant", "content": answer.reply.text})
    return 0


def _turns(interactive: bool):
    """The user's lines: typed at a prompt, or read from a pipe (blank lines skipped)."""
    while True:
        try:
            line = input("> ") if interactive else sys.stdin.readline()
        except EOFError:
            return
        if not interactive and line == "":
            return
        line = line.strip()
        if line:
            yield line
