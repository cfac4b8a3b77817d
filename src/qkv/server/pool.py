"""The KV cache pool's size, from the operator's bounds, and the scheduler that uses it.

The batched scheduler keeps every running sequence's keys and values in one preallocated pool of fixed
*slots* (:mod:`qkv.decoding.batcher`): ``slots`` rows of L positions, L = min(context, --max-prompt-tokens +
--max-tokens), the longest text a request may make. One row costs n_layers x 2 x h_kv x L x d_k numbers
(n_kv_heads for grouped-query attention, fewer than the query heads). The operator bounds it three ways,
and the smallest wins: ``--max-batch`` rows, ``--kv-tokens`` positions (rows of L each), ``--kv-memory`` MiB.

Fixed slots waste the part of a row a short request does not reach; vLLM's PagedAttention instead hands out
small pages as a sequence grows, so memory follows the tokens actually held, at the price of a gather
through a page table in every attention call. docs/serve.md says why qkv keeps slots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qkv.decoding.engine import resolve_engine
from qkv.errors import QkvError
from qkv.server.scheduler import SCHEDULERS, BatchScheduler, SequentialScheduler

if TYPE_CHECKING:
    from qkv.server.service import Service

BATCHED_ENGINES = ("auto", "static")  # the batch changes shape every step: the eager static-cache step


def row_bytes(service: Service, length: int) -> int:
    """Bytes of one slot: keys and values of every layer for ``length`` positions."""
    config = service.config
    weight = next(p for p in service.model.parameters() if p.is_floating_point())
    return config.n_layers * 2 * config.n_kv_heads * length * config.head_dim * weight.element_size()


def pool_shape(service: Service) -> tuple[int, int]:
    """(slots, positions per slot) under the service's limits; QkvError (with the fix) when none fits."""
    limits = service.limits
    length = min(service.context_length, limits.max_prompt_tokens + limits.max_tokens)
    slots = limits.max_batch
    if limits.kv_tokens:
        slots = min(slots, limits.kv_tokens // length)
    one = row_bytes(service, length)
    if limits.kv_memory_mb:
        slots = min(slots, int(limits.kv_memory_mb * 2**20 // one))
    if slots < 1:
        raise QkvError(
            f"the KV cache bound holds no sequence: one takes {length} positions ({one / 2**20:.1f} MiB); raise "
            "--kv-tokens/--kv-memory, or lower --max-prompt-tokens/--max-tokens"
        )
    return slots, length


def make_scheduler(service: Service, name: str, engine: str):
    """The scheduler ``name`` ("batched" or "sequential") for the service's language model."""
    if name not in SCHEDULERS:
        raise QkvError(f"--scheduler {name!r} is unknown: choose one of {', '.join(SCHEDULERS)}")
    mode = resolve_engine(service.model, engine)  # an unknown engine, or a graph engine off CUDA: its line
    if name == "sequential" or mode == "model" and engine == "auto":  # a model the fast step does not know
        scheduler = SequentialScheduler(service.generations, service.metrics, service.model_thread)
    elif engine not in BATCHED_ENGINES:
        raise QkvError(
            f"--engine {engine} does not apply to the batched scheduler, whose batch changes shape at every step "
            "(it runs the static-cache step eagerly): use --engine auto or static, or --scheduler sequential"
        )
    else:
        slots, length = pool_shape(service)
        scheduler = BatchScheduler(service, slots, length, service.metrics, service.model_thread)
        pool = scheduler.batcher
        gauges = service.metrics.gauges
        gauges["qkv_kv_cache_slots"] = ("Rows of the KV cache pool (sequences it can hold).", lambda: pool.slots)
        gauges["qkv_kv_cache_slots_used"] = ("Rows of the pool held by running sequences.",
                                             lambda: len(pool.running))  # fmt: skip
        gauges["qkv_kv_cache_usage_ratio"] = ("Share of the pool's rows in use (0 to 1).",
                                              lambda: len(pool.running) / pool.slots)  # fmt: skip
        gauges["qkv_kv_cache_positions_used"] = ("Cache positions holding running sequences' keys.",
                                                 pool.positions_used)  # fmt: skip
        gauges["qkv_kv_cache_bytes"] = ("Bytes allocated for the pool.", lambda: pool.bytes)
    service.metrics.gauges["qkv_requests_running"] = ("Completion requests generating now.", scheduler.running)
    service.metrics.gauges["qkv_requests_waiting"] = ("Completion requests waiting for a slot.", scheduler.waiting)
    return scheduler
