"""Running the exported graphs (:mod:`qkv.export.onnx`) with ONNX Runtime: greedy generation, greedy
translation and sentence embeddings, on NumPy arrays.

These are the small loops a deployment writes around the graphs, and the tests check them against qkv:
the same logits (within 1e-4) and the same greedy tokens. The loops follow qkv's own decoding
(:mod:`qkv.decoding.generate`, :func:`qkv.decoding.beam_search.greedy_decode`): read the prompt (or
``<bos>``) with empty pasts, then feed one token and the presents back per step, take the most likely next
token, and keep a finished row at ``eos_id``. They do not slide a window past the model's context: prompt
plus new tokens must fit in it.

    gpt = OnnxGPT("gpt.onnx")
    tokens = gpt.generate_greedy([[464, 2068]], max_new_tokens=20)        # (1, 22) token ids
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from qkv.errors import QkvError


def load_session(path: str | Path) -> Any:
    """An ONNX Runtime session for ``path`` on the CPU; a missing file or runtime is a QkvError."""
    try:
        import onnxruntime
    except ImportError:
        raise QkvError("running ONNX files needs onnxruntime: pip install onnxruntime") from None
    path = Path(path)
    if not path.is_file():
        raise QkvError(f"{path} does not exist: write it with `qkv export RUN --out {path.name}`")
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


class _Graph:
    """A session and the qkv config recorded in the file's metadata."""

    def __init__(self, path: str | Path, role: str) -> None:
        self.path = Path(path)
        self.session = load_session(path)
        meta = self.session.get_modelmeta().custom_metadata_map
        if meta.get("qkv.graph") != role:
            raise QkvError(f"{self.path} is not a qkv {role} graph (it says {meta.get('qkv.graph')!r})")
        self.meta = meta
        self.config: dict[str, Any] = json.loads(meta["qkv.config"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def empty_past(self, batch: int, n_layers: int) -> list[np.ndarray]:
        heads = self.config["n_heads"]  # query heads; the cache holds the key/value heads (fewer with GQA)
        shape = (batch, self.config.get("n_kv_heads") or heads, 0, self.config["d_model"] // heads)
        return [np.zeros(shape, dtype=np.float32) for _ in range(2 * n_layers)]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, feeds)


def _ids(token_ids: Any) -> np.ndarray:
    ids = np.asarray(token_ids, dtype=np.int64)
    return ids[None] if ids.ndim == 1 else ids


class OnnxGPT(_Graph):
    """An exported GPT: ``forward`` for logits and presents, ``generate_greedy`` for text."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, "gpt")
        self.n_layers = self.config["n_layers"]

    def forward(self, input_ids: np.ndarray, past: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """(logits (B, T, vocab), presents) for new tokens (B, T) after the positions in ``past``."""
        feeds = {"input_ids": input_ids, **dict(zip(self.inputs[1:], past, strict=True))}
        logits, *presents = self.run(feeds)
        return logits, presents

    def generate_greedy(self, prompt_ids: Any, max_new_tokens: int, *, eos_id: int | None = None) -> np.ndarray:
        """Prompt (B, T) followed by ``max_new_tokens`` greedy tokens: (B, T + max_new_tokens) (fewer if every
        row reached ``eos_id``; finished rows continue with ``eos_id``), as ``qkv.decoding.generate``."""
        ids = _ids(prompt_ids)
        batch, length = ids.shape
        if length + max_new_tokens - 1 > self.config["context_length"]:
            raise QkvError(
                f"{length} prompt tokens + {max_new_tokens} new ones do not fit the context of "
                f"{self.config['context_length']} positions: the ONNX loop does not slide the window; ask for fewer"
            )
        out = [ids]
        done = np.zeros(batch, dtype=bool)
        step_ids, past = ids, self.empty_past(batch, self.n_layers)
        for _ in range(max_new_tokens):
            logits, past = self.forward(step_ids, past)
            next_ids = logits[:, -1].argmax(axis=-1)  # (B,)
            if eos_id is not None:
                next_ids = np.where(done, eos_id, next_ids)
                done |= next_ids == eos_id
            out.append(next_ids[:, None])
            if eos_id is not None and done.all():
                break
            step_ids = next_ids[:, None]
        return np.concatenate(out, axis=1)


class OnnxEncoder(_Graph):
    """An exported encoder: token vectors and sentence embeddings."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, "encoder")

    def forward(self, input_ids: Any, attention_mask: Any | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(last_hidden_state (B, T, d_model), sentence_embedding (B, d_model)); mask 1 at tokens, 0 at padding."""
        ids = _ids(input_ids)
        mask = np.ones_like(ids) if attention_mask is None else _ids(attention_mask)
        hidden, sentence = self.run({"input_ids": ids, "attention_mask": mask})
        return hidden, sentence


class OnnxTranslator:
    """An exported encoder-decoder (NAME.encoder.onnx + NAME.decoder.onnx): greedy translation."""

    def __init__(self, encoder_path: str | Path) -> None:
        self.encoder = _Graph(encoder_path, "translator-encoder")
        self.decoder = _Graph(self.encoder.path.parent / self.encoder.meta["qkv.decoder"], "translator-decoder")
        if self.encoder.meta.get("qkv.export") != self.decoder.meta.get("qkv.export"):
            raise QkvError(
                f"{self.encoder.path} and {self.decoder.path} come from two different exports (one was replaced, "
                "or a re-export was stopped halfway): export again with `qkv export RUN --out NAME.onnx --force`"
            )
        self.n_layers = self.decoder.config["n_decoder_layers"]

    def greedy(
        self, src_ids: Any, attention_mask: Any | None, *, bos_id: int, eos_id: int, max_new_tokens: int
    ) -> list[list[int]]:
        """Each sentence's greedy target ids without ``<bos>``/``<eos>``, at most ``max_new_tokens`` of them
        (``<eos>`` included), as :func:`qkv.decoding.beam_search.greedy_decode` with ``max_len``."""
        src = _ids(src_ids)
        mask = np.ones_like(src) if attention_mask is None else _ids(attention_mask)
        cross = self.encoder.run({"input_ids": src, "attention_mask": mask})
        batch = src.shape[0]
        past = self.decoder.empty_past(batch, self.n_layers)
        names = self.decoder.inputs
        step_ids = np.full((batch, 1), bos_id, dtype=np.int64)
        done = np.zeros(batch, dtype=bool)
        rows: list[np.ndarray] = []
        for _ in range(max_new_tokens):
            feeds = dict(zip(names, [step_ids, mask, *past, *cross], strict=True))
            logits, *past = self.decoder.run(feeds)
            next_ids = np.where(done, eos_id, logits[:, -1].argmax(axis=-1))  # (B,)
            rows.append(next_ids)
            done |= next_ids == eos_id
            if done.all():
                break
            step_ids = next_ids[:, None]
        out = []
        for row in np.stack(rows, axis=1).tolist():
            out.append(row[: row.index(eos_id)] if eos_id in row else row)
        return out
