"""Whole models, one folder per family (GPT, Llama, the BERT-style encoder, the encoder-decoder Transformer;
RNNSearch and Word2Vec before them), the configs they share, the family table and the presets."""

from qkv.models.config import BaseConfig, ModelConfig
from qkv.models.encoder import Encoder, EncoderConfig, mean_pool
from qkv.models.gpt import GPT, GPTConfig
from qkv.models.llama import Llama, LlamaConfig
from qkv.models.next_token import next_token_distribution, next_token_logits
from qkv.models.presets import PRESETS, make_config
from qkv.models.rnnsearch import RNNSearch, RNNSearchConfig
from qkv.models.transformer import Transformer, TransformerConfig
from qkv.models.word2vec import Word2Vec, Word2VecConfig

__all__ = [
    "PRESETS",
    "GPT",
    "BaseConfig",
    "Encoder",
    "EncoderConfig",
    "GPTConfig",
    "Llama",
    "LlamaConfig",
    "ModelConfig",
    "RNNSearch",
    "RNNSearchConfig",
    "Transformer",
    "TransformerConfig",
    "Word2Vec",
    "Word2VecConfig",
    "make_config",
    "mean_pool",
    "next_token_distribution",
    "next_token_logits",
]
