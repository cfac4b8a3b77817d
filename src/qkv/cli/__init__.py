"""The ``qkv`` command. Each verb lives in its own module and registers its flags on a subparser.

Problems with the user's input are :class:`~qkv.errors.QkvError`: printed as one line, exit code 2, no
traceback; so are argparse's usage errors (:class:`qkv.cli.options.QkvParser`). Ctrl-C exits with code 130.
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
    "chat",
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
    "merge",
)

MODULES = {"next": "next_token"}  # a verb whose module has another name (qkv.cli.next would shadow next())


def build_parser() -> argparse.ArgumentParser:
    import importlib

    from qkv.cli.options import QkvParser
    from qkv.version import __version__

    parser = QkvParser(prog="qkv", description="The Transformer, completely and for real.")
    parser.add_argument("--version", action="version", version=f"qkv {__version__}", help="print the version")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND", help="the verb (qkv COMMAND --help)")
    for verb in VERBS:
        module = importlib.import_module(f"qkv.cli.{MODULES.get(verb, verb)}")
        command = sub.add_parser(verb, help=module.HELP, description=module.__doc__)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Options anywhere: the verb's own parser reads its flags and positionals intermixed, so
    ``qkv translate RUN --beam 1 "a" "b"`` gives both sentences (argparse alone stops the positionals at the
    first flag)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verbs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0].choices
    if argv and argv[0] in verbs:
        args = verbs[argv[0]].parse_intermixed_args(argv[1:])
        args.verb = argv[0]
        return args
    return parser.parse_args(argv)  # --help, a misspelt verb: argparse's own messages


def main(argv: Sequence[str] | None = None) -> int:
    from qkv.cli.held_notes import HeldNotes

    parser = build_parser()
    args = parse(parser, argv)
    held = sys.stderr = HeldNotes(sys.stderr)  # notes wait until the input is checked (qkv.cli.held_notes)
    try:
        code = args.run(args) or 0
        held.release()
        return code
    except QkvError as error:
        held.drop()
        print(f"qkv {args.verb}: error: {error}", file=held.stream)
        return error.exit_code
    except KeyboardInterrupt:
        held.release()
        print(f"qkv {args.verb}: interrupted", file=held.stream)
        return 130
    except BaseException:
        held.release()
        raise
    finally:
        sys.stderr = held.stream


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
