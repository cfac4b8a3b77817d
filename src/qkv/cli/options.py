"""What every verb's command line shares: the parser that answers a bad flag in one line, and the flags that
mean one thing everywhere.

- A usage mistake is one line on stderr naming ``--help``, exit code 2 (argparse alone prints the usage
  first, 5 to 9 lines).
- ``--out`` names every file or folder a verb writes; pictures go to the run folder unless ``--out`` says
  otherwise, and never silently over a file in the current folder.
- ``--top N`` (alias ``-k``) is how many entries a table lists; ``--target TEXT`` a translator's target
  side; ``--seed`` defaults to 1337 (as in ``qkv train``); durations take units (``30s``, ``10m``, ``2h``).
- Old spellings stay as aliases, hidden from ``--help`` (:func:`add_alias`).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from qkv.errors import QkvError

if TYPE_CHECKING:
    from torch import nn

SEED_DEFAULT = 1337
"""Every verb's --seed default: `qkv train`'s (so the same command gives the same numbers in every verb)."""


class QkvParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line: ``qkv VERB: error: ... (see qkv VERB --help)``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def add_alias(parser, old: str, *, of: str, dest: str, **kwargs) -> None:
    """``old`` as a hidden spelling of the flag ``of`` (same ``dest``), kept for scripts written before the
    rename; ``--help`` shows only the new name (the help test accepts a hidden action whose dest has help)."""
    parser.add_argument(old, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def add_top_argument(parser, *, default: int | None, what: str) -> None:
    """--top N (alias -k): how many entries are listed."""
    shown = f" (default {default})" if default is not None else ""
    parser.add_argument("--top", "-k", type=int, default=default, metavar="N", help=f"{what}{shown}")


def add_seed_argument(parser, *, what: str, default: int | None = SEED_DEFAULT, shown: str = "") -> None:
    """--seed N, with the default every verb shares."""
    parser.add_argument("--seed", type=int, default=default, metavar="N",
                        help=f"{what} (default {shown or default})")  # fmt: skip


def add_target_argument(parser, *, what: str = "a translator's target text (default: its own greedy translation)",
                        default=None, old: str | None = None) -> None:  # fmt: skip
    """--target TEXT: a translator's target side (what its decoder reads), in every verb; ``old`` a hidden
    former spelling (``--prefix`` in attribute and patch)."""
    parser.add_argument("--target", metavar="TEXT", default=default, help=what)
    if old:
        add_alias(parser, old, of="--target", dest="target")


def add_picture_out(parser, name: str, what: str) -> None:
    """--out FILE for a verb that draws ``name`` (default: in the run folder)."""
    parser.add_argument(
        "--out", metavar="FILE", help=f"{what} (default RUN_DIR/{name}; with --model, ./{name} if there is none)"
    )


def picture_path(out: str | None, run_dir: str | None, name: str) -> Path:
    """Where a picture goes: ``--out`` when given; else RUN_DIR/NAME (replacing an earlier one with a note); else (a
    pretrained --model) ./NAME, but never over a file already there (QkvError naming --out)."""
    if out:
        return Path(out)
    if run_dir and Path(run_dir).is_dir():
        path = Path(run_dir) / name
        if path.exists():
            note(f"replacing {path}, which an earlier run of this view drew: give --out FILE to keep both")
        return path
    here = Path(name)
    if here.exists():
        raise QkvError(f"{name} already exists in this folder: give --out FILE to choose where the picture goes")
    return here


def add_html_argument(parser, what: str) -> None:
    """--html [FILE]: also write a standalone page (default: the picture's name with .html), in lens and
    attention alike."""
    parser.add_argument(
        "--html", nargs="?", const="", metavar="FILE", help=f"also write {what} (default: the --out name with .html)"
    )


def html_path(args, name: str) -> Path:
    """The page --html asked for: its FILE, else the picture's path (:func:`picture_path`) with .html."""
    if args.html:
        return Path(args.html)
    out = str(Path(args.out).with_suffix(".html")) if args.out else None
    return picture_path(out, args.run_dir, str(Path(name).with_suffix(".html")))


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|sec|m|min|h)?\s*$")
_MINUTES = {"s": 1 / 60, "sec": 1 / 60, "m": 1.0, "min": 1.0, "h": 60.0, None: 1.0}


def minutes(text: str) -> float:
    """A duration as minutes: ``30s``, ``10m``, ``1.5h``; a bare number is minutes (as --max-time was)."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: give e.g. 30s, 10m or 2h")
    return float(match.group(1)) * _MINUTES[match.group(2)]


_SECONDS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, None: 1.0}


def seconds(text: str) -> float:
    """A duration as seconds: ``500ms``, ``10s``, ``1m``; a bare number is seconds (as --queue-timeout was)."""
    match = re.match(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|sec|m|min|h)?\s*$", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: give e.g. 500ms, 10s or 1m")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def is_main_process() -> bool:
    """True except in the processes of rank 1 and up under torchrun: notes and summaries print once."""
    import os

    return os.environ.get("RANK", "0") == "0"


def compile_note(step: str) -> None:
    """Say that torch.compile is at work before the first token takes a minute (--step compiled*)."""
    if step.startswith("compiled"):
        note("compiling the decode step with torch.compile: about a minute the first time")


def compiled_note(step: str, model: nn.Module) -> None:
    """After generating with --step compiled*: how long torch.compile took (the compiled step's first call), and
    where its work is kept."""
    if step.startswith("compiled"):
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        from qkv.decoding.fast_step import fast_step_for

        seconds = fast_step_for(model).compile_seconds
        if seconds == 0:  # nothing was generated, or the step was compiled earlier in this process
            return
        note(f"compiling the decode step took {seconds:.1f} s (its first call); Inductor keeps what it compiled in "
             f"{cache_dir()}, so the next run of this model compiles faster")  # fmt: skip


def note(text: str) -> None:
    """A ``note:`` line on stderr, printed by the main process only, once the verb has checked its input: the
    notes held until now come first (:mod:`qkv.cli.held_notes`)."""
    from qkv.cli.held_notes import release_notes

    release_notes()
    if is_main_process():
        sys.stdout.flush()  # the verb's output so far first, then the note
        print(f"note: {text}", file=sys.stderr, flush=True)
