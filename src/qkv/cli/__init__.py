"""The ``qkv`` command. Each verb lives in its own module and registers its flags on a subparser.

Problems with the user's input are :class:`~qkv.errors.QkvError`: printed as one line, exit code 2, no
traceback; so are argparse's usage errors (:class:`qkv.cli.options.QkvParser`). Ctrl-C exits with code 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from qkv.cli.options import QkvParser
from qkv.errors import QkvError

VERBS = {
    "train": "train a GPT (--from MODEL: fine-tune one), a translator (--task translate) or word vectors",
    "prepare": "tokenize a corpus once into memory-mappable token shards",
    "generate": "generate text with a trained GPT",
    "chat": "talk to a chat model (a .gguf file, a Hugging Face folder, or a run)",
    "translate": "translate sentences with a trained encoder-decoder (arguments, --file or stdin)",
    "embed": "embed whole sentences with an encoder, compare them by cosine (for the rows of W_E: qkv embeddings)",
    "eval": "evaluate a trained model on a text file (language models) or a test set (translators)",
    "plot": "draw the loss curve of a run as a PNG",
    "explain": "print one attention head's computation step by step, with real numbers",
    "attention": "draw attention heatmaps (all layers x heads, or one) as PNG and a standalone HTML view",
    "next": "show the next-token distribution at several temperatures (table + bar chart)",
    "embeddings": "token embeddings W_E: neighbours, analogies, a 2-D map; the positional table (sentences: qkv embed)",
    "lens": "logit lens: every layer's top next tokens, read through the final norm and W_U (table + heatmap)",
    "attribute": "direct logit attribution: each layer's and head's push on one token's logit (table + chart)",
    "patch": "activation patching: which layers, positions and heads carry the answer (heatmaps)",
    "heads": "head detector: previous-token, first-token, induction and duplicate-token scores of every head",
    "serve": "serve a model over HTTP, with a web playground",
    "quantize": "save an int8 or int4 copy of a model (the weights; --activations int8 for W8A8)",
    "export": "export a model to ONNX (GPT with its KV cache, encoder, encoder-decoder) or to GGUF (llama.cpp)",
    "merge": "fold a LoRA run's adapters into its base and write the whole model (qkv train --lora makes such runs)",
}
"""Each verb and its line in ``qkv --help``; the verb's flags and code are in ``qkv.cli.<verb>``."""

MODULES = {"next": "next_token"}  # a verb whose module has another name (qkv.cli.next would shadow next())


class VerbParser(QkvParser):
    """A verb's parser whose flags are added when it is first used (to parse, or to print its help): ``qkv
    --help``, ``qkv --version`` and every verb import only their own module, and building the whole parser
    imports no torch."""

    def __init__(self, *args, verb: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.verb, self.loaded = verb, False

    def load(self) -> VerbParser:
        """Import ``qkv.cli.<verb>`` and add its flags (once); return the parser."""
        if not self.loaded:
            self.loaded = True
            module = importlib.import_module(f"qkv.cli.{MODULES.get(self.verb, self.verb)}")
            self.description = module.__doc__
            module.add_arguments(self)
            self.set_defaults(run=module.run)
        return self

    def parse_known_args(self, args=None, namespace=None):
        return super(VerbParser, self.load()).parse_known_args(args, namespace)

    def parse_known_intermixed_args(self, args=None, namespace=None):
        return super(VerbParser, self.load()).parse_known_intermixed_args(args, namespace)

    def format_help(self) -> str:
        return super(VerbParser, self.load()).format_help()

    def format_usage(self) -> str:
        return super(VerbParser, self.load()).format_usage()


def build_parser() -> argparse.ArgumentParser:
    """The ``qkv`` parser: the verbs, each with its flags added on first use (:class:`VerbParser`)."""
    from qkv.version import __version__

    parser = QkvParser(prog="qkv", description="The Transformer, completely and for real.")
    parser.add_argument("--version", action="version", version=f"qkv {__version__}", help="print the version")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND", help="the verb (qkv COMMAND --help)",
                                parser_class=VerbParser)  # fmt: skip
    for verb, help_line in VERBS.items():
        sub.add_parser(verb, help=help_line, verb=verb)
    return parser


def verb_parsers(parser: argparse.ArgumentParser | None = None) -> dict[str, VerbParser]:
    """Every verb's parser with its flags (each verb's module imported): what the command-line tests walk."""
    parser = parser or build_parser()
    choices = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0].choices
    return {verb: verb_parser.load() for verb, verb_parser in choices.items()}


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
