"""RNNSearch (Bahdanau, Cho and Bengio 2015, "Neural Machine Translation by Jointly Learning to Align and
Translate"): the recurrent encoder-decoder for which attention was invented.

The notes on the mathematics of attention and the transformer (2024): "they learned an encoder-decoder model
with a bidirectional RNN ... They used a feedforward network (nonlinear) to learn attention weights,
depending on the current context vector (hidden state), the previous word guessed, and the bidirectional
hidden states concatenated together ... The outputs ... were then softmaxed to produce a valid probability
distribution, and be used as the averaging weights to the next context vector." In the paper's symbols
(m = ``d_embedding``, n = ``d_hidden``, n' = ``d_attention``, l = ``d_readout``)::

    encoder   h_j = [h->_j ; h<-_j]                           bidirectional GRU over E_x x_j   (B, S, 2n)
    decoder   s_0 = tanh(W_s h<-_1)                           the backward state at the first word   (B, n)
    step i    e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j)        additive attention (layers/additive.py)
              alpha_ij = softmax_j(e_ij);  c_i = sum_j alpha_ij h_j                                 (B, 2n)
              s_i = GRU(s_{i-1}, [E_y y_{i-1} ; c_i])         the context is fed to the GRU ...     (B, n)
              t_i = maxout(U_o s_i + V_o E_y y_{i-1} + C_o c_i)   ... and to the output layer        (B, l)
              p(y_i | y_<i, x) = softmax(W_o t_i)                                                    (B, V)

The alignment alpha_ij is this model's cross-attention: queries from the decoder (its state s_{i-1}),
keys and values from the encoder (the annotations h_j). The Transformer kept the idea and replaced the
rest: the recurrences by self-attention, and the learned tanh scorer by a scaled dot product.

Choices, and why:

- **Output layer: maxout**, the paper's "deep output" (pools of 2 over 2l linear values). It is cheap (one
  matrix product for all steps at once, after the recurrence) and gives a readout width l independent of
  n, so W_o can be the target embedding matrix (``tie_embeddings``, as the Transformer's W_U = W_E^T; the
  paper leaves them untied). It reads s_i, as the paper's equation (4), g(y_{i-1}, s_i, c_i), says; its
  appendix writes s_{i-1}.
- **The GRU is torch's** (:mod:`qkv.layers.gru`); the encoder runs as one ``nn.GRU`` call (cuDNN on a GPU).
  The decoder must run step by step: c_i needs s_{i-1}. Everything that does not depend on the previous
  step (the projected keys U_a h_j, the GRU's and the output layer's terms in E_y y_{i-1}, the output layer
  itself) is computed for all steps at once, outside the loop.
- **Decoding** uses qkv's greedy and beam search unchanged: :class:`RNNSearchCache` keeps s_{i-1} and
  U_a h_j, with the same ``length``, ``reorder`` and ``reset`` as the Transformer's KV cache.
- Dropout on the embeddings and the maxout output (not in the paper, which trained on 348M words; Multi30k
  has 0.4M).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.layers.additive import AdditiveAttention
from qkv.layers.capture import record
from qkv.layers.dropout import dropout_layer
from qkv.layers.embedding import InputEmbedding, Unembedding
from qkv.layers.gru import BidirectionalGRU, gru_step
from qkv.layers.maxout import Maxout
from qkv.models.base import EncoderDecoder
from qkv.models.rnnsearch.config import RNNSearchConfig


class RNNSearchCache:
    """What decoding one token at a time keeps between steps: the decoder state s_{i-1} (B, n) and the
    projected keys U_a h_j (B, S, n'), which depend on the source only and are computed once."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.length = 0  # target tokens already fed (the index of the next one)
        self.state: Tensor | None = None
        self.keys: Tensor | None = None

    def reset(self) -> None:
        """Start the target again (s_0 is derived anew from the source); the projected keys stay."""
        self.length = 0
        self.state = None

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search: each row follows the hypothesis it now extends)."""
        if self.state is not None:
            self.state = self.state.index_select(0, index)
        if self.keys is not None:
            self.keys = self.keys.index_select(0, index)


class AttentionGRUDecoder(nn.Module):
    """The decoder's recurrence: at each step attend with s_{i-1}, then update the GRU state with the
    previous target word and the context vector. Returns every s_i and c_i for the output layer."""

    def __init__(self, config: RNNSearchConfig) -> None:
        super().__init__()
        m, n = config.d_embedding, config.d_hidden
        self.d_embedding = m
        self.init_state = nn.Linear(n, n)  # W_s: s_0 = tanh(W_s h<-_1)
        self.attention = AdditiveAttention(query_dim=n, key_dim=2 * n, hidden_dim=config.d_attention)
        self.cell = nn.GRUCell(m + 2 * n, n)  # input [E_y y_{i-1} ; c_i]

    def initial_state(self, memory: Tensor) -> Tensor:
        """s_0 = tanh(W_s h<-_1) (B, n): the backward GRU's state at the first source word, which has read
        the whole sentence (right to left)."""
        n = memory.shape[-1] // 2
        return torch.tanh(self.init_state(memory[:, 0, n:]))

    def forward(
        self,
        embedded: Tensor,
        memory: Tensor,
        keys: Tensor,
        state: Tensor,
        memory_padding_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Run the recurrence over the target embeddings E_y y_{i-1} (B, T, m) from state s_{i-1} (B, n).

        ``memory`` (B, S, 2n) holds the annotations h_j and ``keys`` (B, S, n') their projections U_a h_j.
        Returns the states s_i (B, T, n), the contexts c_i (B, T, 2n) and the last state (B, n).
        """
        m = self.d_embedding
        weight_ih = self.cell.weight_ih  # (3n, m + 2n): the columns for E_y y, then those for c
        word_weight, context_weight = weight_ih.split([m, weight_ih.shape[1] - m], dim=1)  # (3n, m), (3n, 2n)
        word_gates = F.linear(embedded, word_weight, self.cell.bias_ih)  # (B, T, 3n), all steps at once
        states, contexts, alignments = [], [], []
        for gates in word_gates.unbind(dim=1):  # (B, 3n) per step
            context, weights = self.attention(
                state.unsqueeze(1), None, memory, memory_padding_mask, projected_keys=keys
            )  # (B, 1, 2n), (B, 1, S)
            context = context.squeeze(1)  # (B, 2n)
            state = gru_step(gates + F.linear(context, context_weight), state, self.cell.weight_hh, self.cell.bias_hh)
            states.append(state)  # (B, n)
            contexts.append(context)
            alignments.append(weights.squeeze(1))
        # The alignment of every step, recorded under the attention's own name (its per-step records are
        # replaced): (B, 1, T, S), one head, as cross-attention is recorded.
        record(self.attention, "weights", torch.stack(alignments, dim=1)[:, None])
        return torch.stack(states, dim=1), torch.stack(contexts, dim=1), state  # (B, T, n), (B, T, 2n), (B, n)


class RNNSearch(EncoderDecoder):
    """The encoder-decoder of Bahdanau et al. 2015, built from an :class:`RNNSearchConfig`; the same
    ``encode`` / ``decode`` / ``new_cache`` interface as :class:`~qkv.models.transformer.Transformer`."""

    config: RNNSearchConfig

    def __init__(self, config: RNNSearchConfig) -> None:
        super().__init__(config)
        m, n, length = config.d_embedding, config.d_hidden, config.context_length
        common: dict[str, Any] = dict(positional="none", dropout=config.dropout)  # an RNN reads positions in order
        self.src_embedding = InputEmbedding(config.src_vocab_size, m, length, **common)  # E_x
        shared = self.src_embedding.token_embedding if config.share_embeddings else None
        self.tgt_embedding = InputEmbedding(config.tgt_vocab_size, m, length, token_embedding=shared, **common)  # E_y
        self.encoder = BidirectionalGRU(m, n)
        self.decoder = AttentionGRUDecoder(config)
        self.readout = Maxout(n + m + 2 * n, config.d_readout)  # t_i = maxout(U_o s_i + V_o E_y y_{i-1} + C_o c_i)
        self.readout_dropout = dropout_layer(config.dropout)
        tied = self.tgt_embedding.token_embedding if config.tie_embeddings else None
        self.unembedding = Unembedding(config.d_readout, config.tgt_vocab_size, tied_to=tied)  # W_o
        self._init_weights()

    def _init_weights(self) -> None:
        """Embeddings (and an untied W_o) ~ N(0, 1/m), so a tied output layer starts with logits of order 1;
        biases 0; the GRUs and linear maps keep torch's uniform(+-1/sqrt(fan_in))."""
        std = self.config.d_embedding**-0.5
        for module in self.modules():
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, std)
            elif isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if not self.unembedding.tied:
            nn.init.normal_(self.unembedding.weight, 0.0, self.config.d_readout**-0.5)

    def encode(self, src_ids: Tensor, *, src_padding_mask: Tensor | None = None) -> Tensor:
        """The annotations h_j = [h->_j ; h<-_j] ("memory") (B, S, 2n) of source ids (B, S)."""
        self.check_length(src_ids.shape[1], "source")
        memory = self.encoder(self.src_embedding(src_ids), src_padding_mask)  # (B, S, m) -> (B, S, 2n)
        return record(self, "memory", memory)

    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        *,
        memory_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
        cache: RNNSearchCache | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """Next-token logits (B, T, tgt_vocab_size) for target ids (B, T) given the annotations.

        With a ``cache``, ``tgt_ids`` are the new tokens only and the decoder continues from the cached
        state. ``tgt_padding_mask`` is accepted for the Transformer's interface and not needed: the
        recurrence only looks back, so padding at the end of a target never reaches an earlier position.
        """
        start = cache.length if cache is not None else 0
        self.check_length(start + tgt_ids.shape[1], "target")
        state = cache.state if cache is not None else None
        if state is None:
            state = self.decoder.initial_state(memory)  # (B, n)
        keys = cache.keys if cache is not None else None
        if keys is None:
            keys = self.decoder.attention.project_keys(memory)  # U_a h_j (B, S, n'), once per source
        embedded = self.tgt_embedding(tgt_ids)  # (B, T, m): E_y y_{i-1}
        states, contexts, last = self.decoder(embedded, memory, keys, state, memory_padding_mask)
        if cache is not None:
            cache.state, cache.keys, cache.length = last, keys, start + tgt_ids.shape[1]
        if last_only:
            states, embedded, contexts = states[:, -1:], embedded[:, -1:], contexts[:, -1:]
        readout = self.readout(torch.cat([states, embedded, contexts], dim=-1))  # (B, T, n + m + 2n) -> (B, T, l)
        logits = self.unembedding(self.readout_dropout(readout))  # (B, T, V)
        return record(self, "logits", logits)

    def new_cache(self, max_len: int | None = None) -> RNNSearchCache:
        return RNNSearchCache(max_len or self.config.context_length)
