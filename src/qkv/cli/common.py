"""Helpers shared by the commands: loading a model for a verb (:func:`qkv.load`, then its role checked),
the model, device and quantization arguments, notes on unknown tokens."""

from __future__ import annotations

from qkv.cli.options import note
from qkv.errors import QkvError
from qkv.loading import load
from qkv.model_dir import ModelBundle
from qkv.models.family import family_of
from qkv.quantization.int8_linear import ACTIVATIONS


def load_for_use(
    path: str,
    *,
    expect: str,
    device: str = "cpu",
    quantize: str | None = None,
    dequantize: bool = False,
    activations: str | None = None,
) -> ModelBundle:
    """Load a model with :func:`qkv.load` and check that its family has the role the verb needs.

    ``expect`` is a role (:data:`qkv.models.family.ROLES`): "language model", "translator" or "encoder"; a
    translator may be a Transformer or an RNNSearch.
    """
    bundle = load(path, device=device, quantize=quantize, dequantize=dequantize, activations=activations)
    return check_role(bundle, path, expect=expect)


def check_role(bundle: ModelBundle, path: str, *, expect: str) -> ModelBundle:
    """``bundle`` itself when its family has the role ``expect``; a QkvError naming the verb to use otherwise."""
    family = family_of(bundle.model)
    if family.role != expect:
        wanted = ("an " if expect[0] in "aeiou" else "a ") + expect
        raise QkvError(f"{path} holds {family.title}, not {wanted}: use `{family.command}` with it")
    return bundle


def add_model_argument(parser, *, what: str = "a run directory written by `qkv train`") -> None:
    """RUN_DIR as a positional argument, or --model: a run directory or a pretrained model folder/name."""
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help=what)
    parser.add_argument("--model", help=f"{MODEL_HELP} instead of a run")


MODEL_HELP = (
    "a pretrained model: a Hugging Face folder (GPT-2; Llama, Qwen2, SmolLM, Mistral; BERT, MiniLM; Marian), a .gguf "
    "file (llama.cpp's format: llama, qwen2, gpt2, starcoder2) or a Hub name"
)
"""What --model takes, in every verb's help: each family qkv imports (models/*/huggingface.py, models/*/gguf.py)."""


def add_quantize_argument(parser) -> None:
    """--quantize SCHEME: run the model with int8 or int4 weights (quantized as it loads); --dequantize: a GGUF
    file's quantized matrices as float32; --activations: float or int8 inputs for those layers."""
    parser.add_argument(
        "--quantize",
        metavar="SCHEME",
        help="int8: quantize the weights as the model loads (weight-only int8, a scale per 32 weights where the "
        "widths allow, else per output channel; about 3.5x less weight memory); int4: the linear layers in groups "
        "of 32 weights (the unembedding int8; see docs/deploy.md)",
    )
    parser.add_argument(
        "--dequantize",
        action="store_true",
        help="a .gguf file's Q4/Q8 matrices as float32 (its exact numbers, 6-8x the memory) instead of qkv's int4 "
        "and int8 layers",
    )
    parser.add_argument(
        "--activations",
        choices=ACTIVATIONS,
        help="how int8 and int4 layers (a GGUF's blocks, --quantize, a `qkv quantize` folder) treat their inputs: "
        "float (weight-only; a folder's own setting by default), int8, rounded in blocks of 32 too (W8A8, W4A8: "
        "faster, as llama.cpp multiplies; W_2's and W_U's inputs twice), or int8x2, all rounded twice (the "
        "rounding's error rounded again: nearly weight-only's tokens; see docs/generation.md)",
    )


def load_options(args) -> dict:
    """The flags of :func:`add_quantize_argument` as :func:`qkv.load`'s keywords."""
    return {"quantize": args.quantize, "dequantize": args.dequantize, "activations": args.activations}


def model_path(args) -> str:
    """The model the user named with RUN_DIR or --model (exactly one of them)."""
    if args.run_dir and args.model:
        raise QkvError("give the model once: either RUN_DIR or --model")
    if not (args.run_dir or args.model):
        raise QkvError("which model? give a run directory (RUN_DIR) or --model PATH_OR_NAME")
    return args.run_dir or args.model


def add_step_argument(parser) -> None:
    """--step: how each decoding step runs (qkv.decoding.fast_step); --engine, its former name, still works."""
    from qkv.cli.options import add_alias
    from qkv.decoding.fast_step import STEPS

    parser.add_argument(
        "--step",
        choices=STEPS,
        default="auto",
        help="how each decoding step runs: auto (default: a CUDA graph on a GPU; on the CPU the native step where "
        "it applies, else static), model (the model's own forward, the reference), native (the whole step in one "
        "call to C, built once with the system's compiler), static, compiled (torch.compile; slow to start), "
        "graph or compiled-graph (CUDA only)",
    )
    add_alias(parser, "--engine", of="--step", dest="step", choices=STEPS)


def add_device_arguments(parser, *, device: bool = True, default: str = "auto", why: str = "") -> None:
    """--device (default auto; the writers quantize and export: cpu) and --threads: where the model runs, for
    every verb that runs one."""
    if device:
        first = "auto (the default: a CUDA GPU, then Apple's MPS, then the CPU)" if default == "auto" else "auto"
        rest = ", cpu" if default == "auto" else f", cpu (the default{why})"
        parser.add_argument("--device", default=default, help=f"{first}{rest}, cuda, cuda:N or mps")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads torch may use (default: the idle cores)")


def use_device(args) -> str:
    """Apply --threads and resolve --device (QkvError for a device that is absent or not a device); returns
    the device name to load the model on, e.g. "cpu" or "cuda:0"."""
    from qkv.training.device import resolve_device, set_threads

    set_threads(getattr(args, "threads", None))
    return str(resolve_device(getattr(args, "device", "cpu")))


def note_unknown(tokenizer, text: str | list[str], what: str = "the text") -> None:
    """Print (to stderr) how many tokens of ``text`` (or of each sentence of a list) became <unk>, if any: one
    shared line for every verb."""
    from qkv.tokenizers.unknown import unknown_note

    if text:
        line = unknown_note(tokenizer, text, what, readable=True)
        if line:
            note(line.removeprefix("note: "))


def check_top(top: int) -> None:
    """--top is how many rows to list: at least 1 (0 listed nothing, and a negative count sliced from the end)."""
    if top < 1:
        raise QkvError(f"--top {top} must be at least 1")


def check_answer_tokens(bundle: ModelBundle, target: str, token: str | None, foil: str | None) -> None:
    """attribute and patch: --target (a translator's target text) only for translators, and --token/--foil
    each one token of the vocabulary the answer is read from; one line naming the flag otherwise."""
    from qkv.inspect.answer import one_token

    family = family_of(bundle.model)
    if target and not family.two_vocabularies:
        raise QkvError(
            f"--target is for translators: {family.title} continues the text itself (the token to explain is --token)"
        )
    vocabulary = (bundle.target_tokenizer or bundle.tokenizer) if family.two_vocabularies else bundle.tokenizer
    given = (("--token", token), ("--foil", foil))
    ids = {what: one_token(vocabulary, text, what=what) for what, text in given if text is not None}
    if len(ids) == 2 and ids["--token"] == ids["--foil"]:
        raise QkvError("--foil is the same token as --token: give two different tokens")
    limit = family.context_length(bundle.config)
    if target and limit is not None and len(vocabulary.encode(target)) + 1 > limit:
        raise QkvError(f"--target is longer than the model's {limit} positions: shorten it")
