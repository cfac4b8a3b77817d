"""Talk to a chat model in the terminal: each line you type is a user turn, the model's answer streams back.

The conversation is rendered with the model's own chat template (from its GGUF file or its Hugging Face folder;
--chat-template FILE gives another) and the answer ends at the template's end of turn. Typed commands: /reset
forgets the conversation (the --system prompt stays), /exit (or Ctrl-D) ends it, /help lists them. When stdin is
not a terminal (a pipe or a file), every non-empty line is one user turn and only the answers are printed, one per
line, so a script can drive it: printf 'Hi!\\nAnd in French?\\n' | qkv chat model.gguf. A line that names no command
(/frobnicate) is not sent, with a note; begin it with // to send a line that starts with /.
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
    load_options,
    model_path,
    use_device,
)
from qkv.cli.held_notes import release_notes
from qkv.cli.options import compile_note, note
from qkv.cli.sampling import add_sampling_arguments, sampling_params
from qkv.errors import QkvError

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
    if params.max_new_tokens < 1:
        raise QkvError(f"--max-new-tokens {params.max_new_tokens} leaves no room for an answer: give at least 1")
    template = read_template_file(args.chat_template) if args.chat_template else None
    args.device = use_device(args)
    bundle = load_for_use(
        model_path(args),
        expect="language model",
        device=args.device,
        **load_options(args),
    )
    opening = [{"role": "system", "content": args.system}] if args.system else []
    chat_prompt(bundle, [*opening, {"role": "user", "content": "Hi"}], template=template)  # a template, or one line
    release_notes()  # the input is checked: the notes held so far (qkv.cli.held_notes) come now
    compile_note(args.step)
    interactive = sys.stdin.isatty()
    if interactive:
        note(f"chatting with {bundle.path.name}: {COMMANDS}")
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    history, answered = list(opening), 0
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
        if _unknown_command(line):
            note(f"{line.split()[0]} is not a command ({COMMANDS}); to send a line that starts with /, begin it //")
            continue
        line = line[1:] if line.startswith("//") else line
        answered += 1
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
    if not answered and not interactive:
        note("standard input held no line to answer: pipe in one user turn per line, e.g. printf 'Hi!\\n' | qkv chat M")
    return 0


def _unknown_command(line: str) -> bool:
    """A line that looks like a typed command (/word) but names none: it would have gone to the model as text."""
    word = line.split()[0]
    return word.startswith("/") and not word.startswith("//") and word[1:].isalpha()


def _turns(interactive: bool):
    """The user's lines: typed at a prompt, or read from a pipe (blank lines skipped; bytes that are not UTF-8
    replaced, with a note)."""
    while True:
        try:
            line = input("> ") if interactive else _read_line()
        except EOFError:
            return
        if not interactive and line == "":
            return
        line = line.strip()
        if line:
            yield line


def _read_line() -> str:
    """One line of a piped stdin, decoded as UTF-8 (undecodable bytes become U+FFFD, with a note)."""
    raw = sys.stdin.buffer.readline() if hasattr(sys.stdin, "buffer") else sys.stdin.readline().encode()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        note(f"a line of standard input is not UTF-8 (byte 0x{raw[error.start]:02x}): its bad bytes are read as \ufffd")
        return raw.decode("utf-8", errors="replace")
