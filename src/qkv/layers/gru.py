"""The gated recurrent unit (GRU, Cho et al. 2014), the recurrence of RNNSearch's encoder and decoder.

A recurrent network reads a sequence one token at a time and carries a state h_t from each token to the
next, so word order needs no positional encoding, but step t cannot start before step t-1 has finished
(the sequential bottleneck the Transformer removed). The GRU decides, per dimension, how much of the old
state to keep (update gate z) and how much of it to use when proposing the new one (reset gate r):

    r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)          reset gate
    z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)          update gate
    n_t = tanh(W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))     proposed state
    h_t = (1 - z_t) * n_t + z_t * h_{t-1}

These are the equations of ``torch.nn.GRU`` and cuDNN (the paper applies r_t before multiplying by W_hn and
lets z_t weigh the new state instead of the old; the two forms are equally expressive).

- :func:`gru_step`: one step of those equations from precomputed input gates W_i x_t + b_i, so a caller
  whose inputs are partly known in advance (RNNSearch's decoder: the previous target word) computes that
  part for all steps in one matrix product;
- :class:`BidirectionalGRU`: a forward GRU reads the sentence left to right, a backward one right to left,
  and each token's annotation is the two states side by side [h->_j ; h<-_j]: it summarises the words before and
  after token j (the notes on the mathematics of attention: "learning sequential dependencies not only from the
  right, but also from the left").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from qkv.errors import QkvError


def gru_step(input_gates: Tensor, state: Tensor, weight_hh: Tensor, bias_hh: Tensor | None) -> Tensor:
    """h_t (B, n) from the input gates W_i x_t + b_i (B, 3n, in torch's r, z, n order) and h_{t-1} (B, n)."""
    n = state.shape[-1]
    input_rz, input_n = input_gates.split([2 * n, n], dim=-1)  # (B, 2n), (B, n)
    hidden_rz, hidden_n = F.linear(state, weight_hh, bias_hh).split([2 * n, n], dim=-1)  # W_h h_{t-1} + b_h
    reset, update = torch.sigmoid(input_rz + hidden_rz).chunk(2, dim=-1)  # (B, n) each
    proposed = torch.tanh(input_n + reset * hidden_n)  # (B, n)
    return proposed + update * (state - proposed)  # (1 - z) n + z h_{t-1}


class BidirectionalGRU(nn.Module):
    """Annotations h_j = [h->_j ; h<-_j] (B, S, 2n) of a padded batch of sequences (B, S, d_in).

    The backward GRU of each sentence starts at its own last token, not at the padding after it (the batch
    is packed by length), and padding positions come out as zeros.
    """

    def __init__(self, input_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.gru = nn.GRU(input_dim, hidden_dim, batch_first=True, bidirectional=True)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """``padding_mask`` (B, S) is True at padding, which must come after each sentence's tokens."""
        if padding_mask is None or not bool(padding_mask.any()):
            return self.gru(x)[0]  # (B, S, 2n)
        padding_mask = padding_mask.bool()
        if bool((padding_mask[:, :-1] & ~padding_mask[:, 1:]).any()):
            raise QkvError("a source has padding before its tokens: pad sentences at the end (right padding)")
        lengths = (~padding_mask).sum(dim=1)
        if bool((lengths == 0).any()):
            raise QkvError("a source sentence has no tokens: give every sentence at least one token")
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.gru(packed)
        return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]  # (B, S, 2n), zeros at padding
