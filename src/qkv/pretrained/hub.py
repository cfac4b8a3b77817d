"""Finding a pretrained model's folder: a local path, or a Hugging Face Hub name downloaded on demand.

A name such as ``"gpt2"`` or ``"Helsinki-NLP/opus-mt-en-de"`` that is not an existing folder is fetched
with ``huggingface_hub.snapshot_download`` (an optional dependency: ``pip install huggingface_hub``),
which keeps a cache and reuses it offline. Only the files qkv reads are downloaded: config.json, the
weights (safetensors, or pytorch_model.bin when a repository has no safetensors), and the tokenizer files.
When the Hub cannot be reached the error says how to use a folder downloaded elsewhere instead.
"""

from __future__ import annotations

from pathlib import Path

from qkv.errors import QkvError

CONFIG_AND_TOKENIZER_FILES = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.spm",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/*",
]
SAFETENSORS_FILES = ["model.safetensors", "model.safetensors.index.json", "model-*.safetensors"]
PYTORCH_FILES = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]


def _looks_like_path(name: str) -> bool:
    """True for names that can only be paths ("./gpt2", "/models/gpt2", "~/gpt2", "C:\\gpt2")."""
    return name.startswith((".", "/", "~", "\\")) or (len(name) > 1 and name[1] == ":") or name.count("/") > 1


def _has_weights(folder: Path) -> bool:
    return any((folder / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json"))


def download(repo_id: str) -> Path:
    """``snapshot_download`` the files qkv needs from the Hub repository ``repo_id``; return the local folder."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise QkvError(
            f"{repo_id!r} is not a local folder, and downloading it from the Hugging Face Hub needs "
            "huggingface_hub: pip install huggingface_hub (or pass the path of a downloaded model folder)"
        ) from None
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=CONFIG_AND_TOKENIZER_FILES + SAFETENSORS_FILES))
        if not _has_weights(folder):  # older repositories only have pickled PyTorch weights
            folder = Path(snapshot_download(repo_id, allow_patterns=CONFIG_AND_TOKENIZER_FILES + PYTORCH_FILES))
    except Exception as error:  # network errors, offline mode, missing or gated repositories, ...
        raise _download_error(repo_id, error) from None
    return folder


def _download_error(repo_id: str, error: Exception) -> QkvError:
    kind = type(error).__name__
    detail = str(error).strip().splitlines()[0] if str(error).strip() else kind
    if kind in ("RepositoryNotFoundError", "RevisionNotFoundError", "HFValidationError"):
        return QkvError(
            f"there is no model {repo_id!r} on the Hugging Face Hub ({kind}): check the name, "
            "or pass the path of a local model folder"
        )
    if kind == "GatedRepoError":
        return QkvError(f"{repo_id!r} is a gated model on the Hugging Face Hub: log in with `hf auth login` first")
    return QkvError(
        f"could not reach the Hugging Face Hub for {repo_id!r} ({kind}: {detail}): download the model "
        "folder elsewhere (config.json, model.safetensors and the tokenizer files) and pass its path"
    )


def resolve_model_dir(name_or_path: str | Path) -> Path:
    """The local folder of ``name_or_path``: the folder itself if it exists, else a Hub download."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise QkvError(f"{path} is a file: pass the folder that holds config.json and the weights")
    name = str(name_or_path)
    if isinstance(name_or_path, Path) or _looks_like_path(name):
        raise QkvError(f"{path} does not exist: check the path to the model folder")
    return download(name)
