"""Whole models (GPT, encoder, encoder-decoder Transformer; RNNSearch and Word2Vec before them), their configs
and presets."""

from qkv.models.config import (
    BaseConfig,
    EncoderConfig,
    GPTConfig,
    ModelConfig,
    RNNSearchConfig,
    TransformerConfig,
    Word2VecConfig,
)
from qkv.models.encoder import Encoder, mean_pool
from qkv.models.gpt import GPT
from qkv.models.next_token import next_token_distribution, next_token_logits
from qkv.models.presets import PRESETS, make_config
from qkv.models.rnnsearch import RNNSearch
from qkv.models.transformer import Transformer
from qkv.models.word2vec import Word2Vec

__all__ = [
    "PRESETS",
    "GPT",
    "BaseConfig",
    "Encoder",
    "EncoderConfig",
    "GPTConfig",
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
