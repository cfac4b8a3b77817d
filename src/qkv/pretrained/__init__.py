"""Pretrained Hugging Face models (GPT-2, BERT/MiniLM, Marian/OPUS-MT) as qkv models.

>>> from qkv.pretrained import load_pretrained, save_as_qkv
>>> bundle = load_pretrained("path/to/gpt2")          # or a Hub name such as "gpt2" when online  # doctest: +SKIP
>>> bundle.model, bundle.tokenizer                     # a qkv GPT and its byte-level BPE tokenizer  # doctest: +SKIP
>>> save_as_qkv(bundle, "runs/gpt2")                   # qkv's own folder; load_model_dir reads it  # doctest: +SKIP

Each architecture module holds one name-mapping table (Hugging Face name -> qkv name, transform) and
the list of Hugging Face tensors it deliberately leaves out; :mod:`qkv.pretrained.loader` applies it.
"""

from qkv.pretrained.bert import SentenceHead, convert_bert, embed_sentences, encode_for_bert, read_sentence_head
from qkv.pretrained.gpt2 import convert_gpt2
from qkv.pretrained.hub import resolve_model_dir
from qkv.pretrained.loader import load_pretrained, read_hf_config, read_hf_weights, save_as_qkv
from qkv.pretrained.marian import convert_marian

__all__ = [
    "SentenceHead",
    "convert_bert",
    "convert_gpt2",
    "convert_marian",
    "embed_sentences",
    "encode_for_bert",
    "load_pretrained",
    "read_hf_config",
    "read_hf_weights",
    "read_sentence_head",
    "resolve_model_dir",
    "save_as_qkv",
]
