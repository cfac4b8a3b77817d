"""The KV cache pool's size, from the operator's bounds, and the scheduler that uses it.

The batched scheduler keeps every running sequence's keys and values in one preallocated pool of fixed
*slots* (:mod:`qkv.decoding.engine`): ``slots`` rows of L positions, L = min(context, --max-prompt-tokens +
--max-tokens), the longest text a request may make. One row costs n_layers x 2 x h_kv x L x d_k numbers
(n_kv_heads for grouped-query attention, fewer than the query heads). The operator bounds it three ways,
and the smallest wins: ``--max-batch`` rows, ``--kv-tokens`` positions (rows of L each), ``--kv-memory`` MiB.

Fixed slots waste the part of a row a short request does not reach; vLLM's PagedAttention instead hands out
small pages as a sequence grows, so memory follows the tokens actually held, at the price of a gather
through a page table in every attention call. docs/serve.md says why qkv keeps slots.
"""

from __future__ import annotations

from torch import nn

from qkv.decoding.fast_step import resolve_step
from qkv.errors import QkvError
from qkv.models.family import family_of
from qkv.models.memory import available_memory, kv_cache_bytes_per_token
from qkv.server.limits import Gate, Limits
from qkv.server.metrics import Metrics
from qkv.server.model_thread import ModelThread
from qkv.server.scheduler import SCHEDULERS, BatchScheduler, SequentialScheduler


def row_bytes(model: nn.Module, length: int) -> int:
    """Bytes of one slot: keys and values of every layer for ``length`` positions."""
    weight = next(p for p in model.parameters() if p.is_floating_point())
    return length * kv_cache_bytes_per_token(model.config, weight.dtype)


def pool_shape(model: nn.Module, limits: Limits) -> tuple[int, int]:
    """(slots, positions per slot) under ``limits``; QkvError (with the fix) when none fits."""
    context = family_of(model).context_length(model.config)
    if not context:
        raise QkvError(f"a {family_of(model).name} model generates no text over a context: serve a language model")
    length = min(context, limits.max_prompt_tokens + limits.max_tokens)
    slots = limits.max_batch
    if limits.kv_tokens:
        slots = min(slots, limits.kv_tokens // length)
    one = row_bytes(model, length)
    if limits.kv_memory_mb:
        slots = min(slots, int(limits.kv_memory_mb * 2**20 // one))
    if slots < 1:
        raise QkvError(
            f"the KV cache bound holds no sequence: one takes {length} positions ({one / 2**20:.1f} MiB); raise "
            "--kv-tokens/--kv-memory, or lower --max-prompt-tokens/--max-tokens"
        )
    weight = next(p for p in model.parameters() if p.is_floating_point())
    free = available_memory(weight.device)
    if free is not None and slots * one > free:
        raise QkvError(
            f"a KV cache pool of {slots:,} rows of {length:,} positions needs {slots * one / 2**30:,.1f} GiB, but "
            f"{weight.device} has {free / 2**30:.1f} GiB available: lower --max-batch, or bound the pool with "
            f"--kv-memory MB (one row takes {one / 2**20:.1f} MiB)"
        )
    return slots, length


def make_scheduler(
    name: str, model: nn.Module, limits: Limits, gate: Gate, metrics: Metrics, worker: ModelThread, step: str
) -> BatchScheduler | SequentialScheduler:
    """The scheduler ``name`` ("batched" or "sequential") for a language model, its pool's gauges registered."""
    if name not in SCHEDULERS:
        raise QkvError(f"--scheduler {name!r} is unknown: choose one of {', '.join(SCHEDULERS)}")
    resolve_step(model, step)  # an unknown step, or a graph step off CUDA: its line
    if name == "sequential":
        scheduler: BatchScheduler | SequentialScheduler = SequentialScheduler(model, gate, metrics, worker, step)
    else:
        slots, length = pool_shape(model, limits)
        scheduler = BatchScheduler(model, slots, length, limits.queue_timeout, metrics, worker, step)
        pool = scheduler.engine
        gauges = metrics.gauges
        gauges["qkv_kv_cache_slots"] = ("Rows of the KV cache pool (sequences it can hold).", lambda: pool.slots)
        gauges["qkv_kv_cache_slots_used"] = ("Rows of the pool held by running sequences.",
                                             lambda: len(pool.running))  # fmt: skip
        gauges["qkv_kv_cache_usage_ratio"] = ("Share of the pool's rows in use (0 to 1).",
                                              lambda: len(pool.running) / pool.slots)  # fmt: skip
        gauges["qkv_kv_cache_positions_used"] = ("Cache positions holding running sequences' keys.",
                                                 pool.positions_used)  # fmt: skip
        gauges["qkv_kv_cache_bytes"] = ("Bytes allocated for the pool.", lambda: pool.bytes)
    metrics.gauges["qkv_requests_running"] = ("Completion requests generating now.", scheduler.running)
    metrics.gauges["qkv_requests_waiting"] = ("Completion requests waiting for a slot.", scheduler.waiting)
    return scheduler
