"""The ``qkv`` command. Each verb lives in its own module and registers its flags on a subparser.

Problems with the user's input are :class:`~qkv.errors.QkvError`: printed as one line, exit code 2, no
traceback. Ctrl-C exits with code 130.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from qkv.errors import QkvError

VERBS = (
    "train",
    "prepare",
    "generate",
    "translate",
    "embed",
    "eval",
    "plot",
    "explain",
    "attention",
    "next",
    "embeddings",
    "lens",
    "attribute",
    "patch",
    "heads",
    "serve",
    "quantize",
    "export",
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="qkv", description="The Transformer, completely and for real.")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    for verb in VERBS:
        module = importlib.import_module(f"qkv.cli.{verb}")
        command = sub.add_parser(verb, help=module.HELP, description=module.__doc__)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except QkvError as error:
        print(f"qkv {args.verb}: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"qkv {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
