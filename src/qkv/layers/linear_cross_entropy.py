"""The unembedding and the cross-entropy in one pass over a few rows at a time, never holding every row's logits.

A language model's loss is the mean over the counted positions of -log softmax(h W_U^T + b)[target]. Written out,
the logits of a batch are (tokens, vocabulary): SmolLM2's 49,152 entries for 1,024 tokens are 200 MB, and the
log-softmax and its gradient are as large again. Here each chunk of rows computes its logits, its loss and, while
the logits are at hand, their gradient (softmax - one-hot, the rows not counted set to zero), and from it the
gradients of h and of W_U (and b); the logits are then dropped:

    z = h W^T + b                 (c, V) for a chunk of c rows
    loss_c = sum_i [logsumexp(z_i) - z_i[t_i]]
    dL/dz = softmax(z) - onehot(t)                     (c, V), then
    dL/dh = dL/dz W  (c, d),   dL/dW += dL/dz^T h  (V, d),   dL/db += sum_i dL/dz_i

The backward pass only scales these by dL/dloss / n (n counted rows). The arithmetic is that of the usual
path (the same products), in about a vocabulary-sized chunk of memory instead of three batch-sized ones (the
technique of Liger Kernel's fused linear cross-entropy and of Apple's "Cut Your Losses", done here with plain
torch products). Targets equal to ``ignore_index`` count for nothing, as in ``F.cross_entropy``. The softmax and its
gradient of a float32 chunk run in C where the library takes them (:mod:`qkv.native.cross_entropy`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.layers.linear import (
    autocast_bfloat16,
    bfloat16_weight,
    packable,
    packed_copy_product,
    packed_now,
    packed_product,
    packed_transposed_product,
    packs,
)
from qkv.native import cross_entropy as native_cross_entropy

CHUNK_ELEMENTS = 1 << 23  # logits per chunk (32 MB of float32): chunk rows = this / vocabulary size


def _chunks(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, ignore_index: int, grads: dict | None
) -> tuple[Tensor, Tensor]:
    """(sum of the counted rows' losses, their number); with ``grads`` ({"h", "w", "b"}: tensors or None), the
    unscaled gradients too, written into them chunk by chunk."""
    counted = targets != ignore_index  # (N,)
    wide = torch.promote_types(weight.dtype, torch.float32)  # the softmax in float32 at least
    total = torch.zeros((), dtype=wide, device=hidden.device)
    rows = max(1, CHUNK_ELEMENTS // weight.shape[0])
    # A frozen W_U under bfloat16 autocast: its bfloat16 copy, made once, instead of a cast at every product
    low = bfloat16_weight(weight) if packs(weight) and autocast_bfloat16(hidden) else None
    # A trained W_U over several chunks: packed once for them all (a reorder costs about one chunk's product, and
    # each chunk's product from the packed copy took 0.56x as long for SmolLM2's 170 rows x 49,152)
    now = None
    if low is None and not packs(weight) and packable(weight) and hidden.dtype == weight.dtype:
        now = packed_now(weight) if hidden.shape[0] > rows else None
    first = True  # the first chunk writes dL/dW, the others add to it
    for start in range(0, hidden.shape[0], rows):
        h, t, keep = (
            hidden[start : start + rows],
            targets[start : start + rows].masked_fill(~counted[start : start + rows], 0),  # any index: not read
            counted[start : start + rows],
        )
        packed = packs(weight) and h.dtype == weight.dtype  # a frozen W_U (LoRA): oneDNN's packed copy
        if low is not None:
            logits = F.linear(h.to(low.dtype), low, None if bias is None else bias.to(low.dtype)).to(wide)  # (c, V)
        elif now is not None:
            logits = packed_copy_product(h, now, weight.shape[0], bias).to(wide)
        else:
            logits = (packed_product(h, weight, bias) if packed else F.linear(h, weight, bias)).to(wide)
        loss, grad = _loss_and_gradient(logits, t, keep, gradient=grads is not None)
        total += loss
        if grad is None or grads is None:
            continue
        if grads["h"] is not None:  # (c, d)
            if packed and low is None:
                grads["h"][start : start + rows] = packed_transposed_product(grad, weight)
            else:
                by = low if low is not None else weight
                grads["h"][start : start + rows] = grad.to(by.dtype) @ by
        if grads["w"] is not None:  # (V, d)
            if first:
                torch.mm(grad.T, h.to(wide), out=grads["w"])
            else:
                grads["w"].addmm_(grad.T, h.to(wide))
        if grads["b"] is not None:
            grads["b"] += grad.sum(0)
        first = False
    if first and grads is not None and grads["w"] is not None:  # no rows at all
        grads["w"].zero_()
    return total, counted.sum()


def _loss_and_gradient(logits: Tensor, t: Tensor, keep: Tensor, *, gradient: bool) -> tuple[Tensor, Tensor | None]:
    """The counted rows' summed loss and, with ``gradient``, dL/dz = softmax - one-hot (rows not counted: zero),
    computed in the logits' memory."""
    if native_cross_entropy.applies(logits):  # one read of each row in C
        losses = native_cross_entropy.cross_entropy_(logits, t, keep, gradient=gradient)
        return losses.sum(), logits if gradient else None
    picked = logits.gather(1, t[:, None])[:, 0]  # (c,)
    top = logits.amax(dim=-1, keepdim=True)  # (c, 1)
    shifted = logits.sub_(top).exp_()  # exp(z - max z), in the logits' memory: one pass for lse and softmax
    sums = shifted.sum(dim=-1)
    lse = sums.log() + top[:, 0]  # logsumexp(z)
    loss = ((lse - picked) * keep).sum()
    if not gradient:
        return loss, None
    grad = shifted.div_(sums[:, None])  # softmax
    grad[torch.arange(len(t), device=t.device), t] -= 1.0
    return loss, grad.mul_(keep[:, None])  # rows not counted: no gradient


class LinearCrossEntropy(torch.autograd.Function):
    """mean cross-entropy of ``hidden W^T + bias`` (N, V) against ``targets`` (N,), its gradients computed in the
    forward pass (see the module docstring)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, ignore_index):  # noqa: ANN001, ANN205
        wide = torch.promote_types(weight.dtype, torch.float32)
        grads = {
            "h": torch.empty_like(hidden) if ctx.needs_input_grad[0] else None,
            "w": torch.empty_like(weight, dtype=wide) if ctx.needs_input_grad[1] else None,  # written by _chunks
            "b": torch.zeros_like(bias, dtype=wide) if bias is not None and ctx.needs_input_grad[2] else None,
        }
        total, n = _chunks(hidden, weight, bias, targets, ignore_index, grads)
        count = n.clamp(min=1).to(total.dtype)
        ctx.save_for_backward(grads["h"], grads["w"], grads["b"], count)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return total / count

    @staticmethod
    def backward(ctx, grad_loss):  # noqa: ANN001, ANN205
        grad_h, grad_w, grad_b, count = ctx.saved_tensors
        scale = grad_loss / count
        out_h = None if grad_h is None else grad_h * scale.to(grad_h.dtype)
        out_w = None if grad_w is None else (grad_w * scale).to(ctx.dtypes[0])
        out_b = None if grad_b is None else (grad_b * scale).to(ctx.dtypes[1])
        return out_h, out_w, out_b, None, None


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *, ignore_index: int = -100
) -> Tensor:
    """``F.cross_entropy(F.linear(hidden, weight, bias).flatten(0, -2), targets.flatten(), ignore_index=...)`` for
    hidden states (..., d) and targets (...), without the logits of the whole batch in memory. A mean over the
    counted targets (0 when none counts)."""
    hidden, targets = hidden.flatten(0, -2), targets.flatten()
    inputs = (hidden, weight) if bias is None else (hidden, weight, bias)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return LinearCrossEntropy.apply(hidden, weight, bias, targets, ignore_index)
    with torch.no_grad():
        total, n = _chunks(hidden, weight, bias, targets, ignore_index, None)
        return total / n.clamp(min=1)
