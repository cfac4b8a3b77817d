"""Metrics (qkv.server.metrics): Prometheus' text format, histograms cumulative, one log line per request."""

from __future__ import annotations

import time
from types import SimpleNamespace

from qkv.server.metrics import Histogram, Metrics


def test_a_histogram_is_cumulative_with_sum_and_count() -> None:
    h = Histogram((0.1, 1.0))
    for value in (0.05, 0.5, 0.7, 3.0):
        h.observe(value)
    assert h.lines("t") == ['t_bucket{le="0.1"} 1', 't_bucket{le="1.0"} 3', 't_bucket{le="+Inf"} 4',
                            "t_sum 4.25", "t_count 4"]  # fmt: skip


def test_a_finished_request_is_counted_timed_and_logged(caplog) -> None:
    metrics = Metrics()
    metrics.gauges["qkv_requests_running"] = ("Requests now.", lambda: 2)
    start = time.perf_counter()
    job = SimpleNamespace(arrived=start, started=start + 0.01, first_token=start + 0.09, last_token=start + 0.49,
                          choices=[1], id="cmpl-x",
                          usage=lambda: {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8})  # fmt: skip
    with caplog.at_level("INFO", logger="qkv.serve"):
        metrics.request_done(job, "ok", "batched")
    text = metrics.render()
    assert 'qkv_requests_total{status="ok"} 1' in text and "qkv_requests_running 2.0" in text
    assert 'qkv_time_to_first_token_seconds_bucket{le="0.1"} 1' in text  # 0.09 s from arrival to the first token
    assert "# TYPE" in text and "# HELP" in text
    (line,) = [r.getMessage() for r in caplog.records]
    assert "completion cmpl-x status=ok scheduler=batched prompt_tokens=3 completion_tokens=5" in line
    assert "tpot=100.0ms" in line  # (0.49 - 0.09) / (5 - 1)
