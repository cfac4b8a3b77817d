"""Pretrained Hugging Face models (GPT-2, Llama/Qwen2/Mistral, BERT/MiniLM, Marian/OPUS-MT) as qkv models.

>>> from qkv.pretrained import load_pretrained, save_as_qkv
>>> bundle = load_pretrained("path/to/gpt2")          # or a Hub name such as "gpt2" when online  # doctest: +SKIP
>>> bundle.model, bundle.tokenizer                     # a qkv GPT and its byte-level BPE tokenizer  # doctest: +SKIP
>>> save_as_qkv(bundle, "runs/gpt2")                   # qkv's own folder; load_model_dir reads it  # doctest: +SKIP

Each family's folder holds its conversion (``qkv/models/gpt/huggingface.py``, ...): one name-mapping table
(Hugging Face name -> qkv name, transform) and the list of Hugging Face tensors it deliberately leaves out,
applied by :mod:`qkv.models.hf_tables`. This package finds the folder (:mod:`~qkv.pretrained.hub`), picks the
family from config.json (:mod:`~qkv.pretrained.loader`) and pools sentence vectors
(:mod:`~qkv.pretrained.sentences`).
"""

from qkv.models.encoder.huggingface import convert_bert
from qkv.models.gpt.huggingface import convert_gpt2
from qkv.models.llama.huggingface import convert_llama
from qkv.models.transformer.huggingface import convert_marian
from qkv.pretrained.gguf import load_gguf
from qkv.pretrained.hub import resolve_model_dir
from qkv.pretrained.loader import load_pretrained, read_hf_config, read_hf_weights, save_as_qkv
from qkv.pretrained.sentences import SentenceHead, embed_sentences, encode_for_bert, read_sentence_head

__all__ = [
    "SentenceHead",
    "convert_bert",
    "convert_gpt2",
    "convert_llama",
    "convert_marian",
    "embed_sentences",
    "encode_for_bert",
    "load_gguf",
    "load_pretrained",
    "read_hf_config",
    "read_hf_weights",
    "read_sentence_head",
    "resolve_model_dir",
    "save_as_qkv",
]
