"""The KV cache pool's size (qkv.server.pool): the smallest of --max-batch, --kv-tokens and --kv-memory, and one
line when none fits; the scheduler it makes registers the pool's gauges."""

from __future__ import annotations

import pytest
import torch

from qkv.errors import QkvError
from qkv.server.limits import Gate, Limits
from qkv.server.metrics import Metrics
from qkv.server.model_thread import ModelThread
from qkv.server.pool import make_scheduler, pool_shape, row_bytes
from tests.conftest import tiny_gpt


def test_one_row_is_every_layers_keys_and_values_for_its_positions() -> None:
    model = tiny_gpt(dtype=torch.float32)
    c = model.config
    assert row_bytes(model, 10) == c.n_layers * 2 * c.n_kv_heads * 10 * c.head_dim * 4


def test_the_smallest_bound_wins_and_none_fitting_is_one_line() -> None:
    model = tiny_gpt(context_length=40)
    limits = Limits(max_prompt_tokens=20, max_tokens=30, max_batch=16)  # L = min(40, 50) = 40
    assert pool_shape(model, limits) == (16, 40)
    assert pool_shape(model, Limits(max_prompt_tokens=20, max_tokens=30, kv_tokens=100)) == (2, 40)
    one = row_bytes(model, 40)
    assert pool_shape(model, Limits(max_prompt_tokens=20, max_tokens=30, kv_memory_mb=3.5 * one / 2**20))[0] == 3
    with pytest.raises(QkvError, match="the KV cache bound holds no sequence"):
        pool_shape(model, Limits(kv_tokens=10))


def test_the_scheduler_and_its_gauges() -> None:
    model, metrics = tiny_gpt(), Metrics()
    limits = Limits(max_batch=3)
    gate = Gate(limits.max_concurrent, limits.queue_timeout, "generations")
    batched = make_scheduler("batched", model, limits, gate, metrics, ModelThread(), "auto")
    assert batched.name == "batched" and batched.engine.slots == 3
    assert metrics.gauges["qkv_kv_cache_slots"][1]() == 3 and metrics.gauges["qkv_kv_cache_slots_used"][1]() == 0
    assert make_scheduler("sequential", model, limits, gate, Metrics(), ModelThread(), "auto").name == "sequential"
    with pytest.raises(QkvError, match="--scheduler 'fifo' is unknown"):
        make_scheduler("fifo", model, limits, gate, metrics, ModelThread(), "auto")
