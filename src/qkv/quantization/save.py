"""Writing a quantized model folder (``qkv quantize``): quantize a loaded model, optionally calibrated on text.

    from qkv.quantization.save import save_quantized
    save_quantized(qkv.load("runs/shakespeare"), "runs/shakespeare-int8", calibration_text=text)

The folder is a model folder like any other (:mod:`qkv.model_dir`, with the ``quantization.json`` of
:mod:`qkv.quantization.format`) and opens with :func:`qkv.load`. Calibration runs the model's own forward on
the text, the way its role uses it (a language model reads running text, an encoder embeds sentences), so
this module sits above the training and pretrained code that runs those forwards.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from torch import nn

from qkv.errors import QkvError
from qkv.io import check_writable, remove_killed_writes_in
from qkv.model_dir import (
    CHAT_TEMPLATE_FILE,
    CONFIG_FILE,
    MODEL_FILE,
    QUANTIZATION_FILE,
    TARGET_TOKENIZER_FILE,
    TOKENIZER_FILE,
    read_tensors,
    save_model_dir,
)
from qkv.models.family import ENCODER, LANGUAGE_MODEL, WORD_VECTORS, family_of
from qkv.pretrained.sentences import copy_sentence_head, embed_sentences
from qkv.quantization.model import check_group_size_fits, check_scheme, group_sizes, is_quantized, quantize_model
from qkv.quantization.smoothing import Progress, smoothing_feed
from qkv.training.perplexity import token_log_probs

if TYPE_CHECKING:
    from qkv.models.gpt.model import GPT


def _remove_interrupted_writes(out: Path) -> None:
    """Delete the temporary files (``.NAME.XXXX.tmp``, :func:`qkv.io.atomic_write`) that an interrupted
    quantize left in ``out``: they are never a finished file, and a re-run would otherwise refuse the folder."""
    leftovers = remove_killed_writes_in(out)
    if leftovers:
        print(f"note: removed {len(leftovers)} unfinished file(s) an interrupted run left in {out}", file=sys.stderr)


MODEL_FILES = {MODEL_FILE, TOKENIZER_FILE, TARGET_TOKENIZER_FILE, CHAT_TEMPLATE_FILE, QUANTIZATION_FILE}


def _unfinished_copy(out: Path) -> bool:
    """Whether ``out`` holds what a ``qkv quantize`` killed before its last file leaves: the files a model folder
    holds, quantized weights among them, and no config.json (:func:`~qkv.model_dir.save_model_dir` writes it last)."""
    if not out.is_dir() or (out / CONFIG_FILE).exists():
        return False
    names = {path.name for path in out.iterdir()}
    if not names or not names <= MODEL_FILES or MODEL_FILE not in names:
        return False
    try:
        return bool(read_tensors(out / MODEL_FILE)[1].get("quantization"))
    except QkvError:  # the weights themselves cut short: the same command writes them again
        return True


def _check_out_dir(out: Path, source: Path) -> None:
    """Refuse an output folder whose files a quantized copy would overwrite or mix with."""
    if out.exists() and not out.is_dir():
        raise QkvError(f"--out {out} is a file: give a folder for the quantized model")
    if out.resolve() == source.resolve():
        raise QkvError(f"--out {out} is the model itself: its float weights would be replaced; give a new folder")
    if (out / "train_config.json").exists() or (out / "checkpoints").exists():
        raise QkvError(f"--out {out} holds a training run, whose weights would be replaced: give a new folder")
    if out.is_dir():
        _remove_interrupted_writes(out)
    if _unfinished_copy(out):
        print(f"note: {out} holds a quantized copy that was stopped before its config.json was written: replacing "
              "it", file=sys.stderr)  # fmt: skip
        return check_writable(out)
    if out.is_dir() and any(out.iterdir()) and not (out / "quantization.json").is_file():
        names = sorted(p.name for p in out.iterdir())
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise QkvError(f"--out {out} already holds other files ({shown}): give a new or empty folder")
    check_writable(out)  # before calibrating, which takes minutes on a large model


def text_calibration(bundle: Any, text: str) -> Callable[[nn.Module], object]:
    """A ``calibration`` feed for :func:`quantize_model` from sample text, for the model in ``bundle``.

    A language model reads ``text`` as running text (in windows of its context); an encoder embeds its
    non-empty lines as sentences. Both run the model's own forward, so every layer sees its inputs.
    """
    model = bundle.model
    family = family_of(model)
    if family.role == LANGUAGE_MODEL:
        ids = bundle.tokenizer.encode(text)
        return lambda m: token_log_probs(cast("GPT", m), ids)  # a language model is a GPT
    if family.role == ENCODER:
        lines = [line for line in text.splitlines() if line.strip()]

        def embed(m: nn.Module) -> object:
            with_model = copy.copy(bundle)
            with_model.model = m
            return embed_sentences(with_model, lines, step="model")

        return embed
    raise QkvError(
        f"calibration text works for language models and encoders, and this is {family.title}: quantize it "
        "without --calibrate (nearest rounding)"
    )


def _smoothing(bundle: Any, text: str | None) -> Callable[[nn.Module], object] | None:
    """SmoothQuant's feed: the calibration text, else a page of the built-in corpus."""
    from qkv.data.builtin import calibration_sample

    return smoothing_feed(bundle, calibration_sample() if text is None else text)


def save_quantized(  # noqa: PLR0913 (each of `qkv quantize`'s options, one keyword each)
    bundle: Any,
    out_dir: str | Path,
    scheme: str = "int8",
    *,
    calibration_text: str | None = None,
    activations: str = "float",
    group_size: int | None = None,
    int8_group_size: int | None = None,
    smooth: bool = True,
    progress: Progress | None = None,
) -> Path:
    """Quantize ``bundle.model`` (a :class:`~qkv.model_dir.ModelBundle`) in place and save it as a model folder.

    The folder loads with :func:`qkv.load` like any other, int8 layers and all; a sentence-transformers head
    (pooling, normalisation) beside the source model is copied along. With ``calibration_text`` the
    roundings are calibrated on it (:func:`text_calibration`, :mod:`qkv.quantization.gptq`). ``activations``
    "int8" makes the int8 and int4 layers quantize their inputs too (W8A8, W4A8: :mod:`qkv.quantization.dynamic`,
    :mod:`qkv.quantization.activation_blocks`), recorded in quantization.json so that the folder loads that way.
    ``scheme`` "int4" makes the linear layers int4 in groups of ``group_size`` weights (default 32; the unembedding
    int8, per row unless ``int8_group_size``); with "int8", ``group_size`` > 0 gives the int8 layers a scale per
    group of that many weights (default 0: per row). Recorded in quantization.json (:mod:`qkv.quantization.format`).
    With int8 activations and ``smooth``, the inputs' large channels are first moved into the weights
    (:func:`smoothing_feed`). ``progress`` is :func:`~qkv.quantization.quantize_model`'s.
    """
    check_scheme(scheme)
    group_sizes(scheme, group_size, int8_group_size)  # the values themselves, before anything is read
    family = family_of(bundle.model)
    if family.role == WORD_VECTORS:  # "1.0x smaller" with nothing quantized, before this line
        raise QkvError(
            f"quantization rounds the weights of linear layers, and {family.title} has none (its vectors are "
            "looked up, not multiplied): use the run as it is with `qkv embeddings`"
        )
    out = Path(out_dir)
    _check_out_dir(out, Path(bundle.path))
    if is_quantized(bundle.model):
        raise QkvError(f"{bundle.path} is quantized already: quantize the float model it was made from")
    calibration = None if calibration_text is None else text_calibration(bundle, calibration_text)
    check_group_size_fits(bundle.model, scheme, group_size, int8_group_size)  # before calibrating (minutes)
    quantize_model(
        bundle.model,
        scheme,
        calibration=calibration,
        activations=activations,
        group_size=group_size,
        int8_group_size=int8_group_size,
        smoothing=_smoothing(bundle, calibration_text) if smooth and activations == scheme == "int8" else None,
        progress=progress,
    )
    save_model_dir(out, bundle.model, bundle.tokenizer, bundle.target_tokenizer, chat_template=bundle.chat_template)
    copy_sentence_head(bundle.path, out)
    return out
