"""``GET /metrics``: the server's counters in Prometheus' text format, and one log line per request.

The names follow what vLLM and Hugging Face TGI expose, so a dashboard built for them reads these too:
requests running and waiting, tokens generated, time to first token (from arrival to the first generated
token: queueing plus prefill) and time per output token (the decode rate one client sees) as histograms,
and how full the KV cache pool is. The text format (``# HELP``, ``# TYPE``, then ``name{labels} value``
lines; a histogram as cumulative ``_bucket{le=...}`` counts, ``_sum`` and ``_count``) is the one
Prometheus scrapes: https://prometheus.io/docs/instrumenting/exposition_formats/

Everything here is a plain number behind a lock, written from the decoding thread and read by the event
loop; nothing is kept per request, so memory does not grow with traffic.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qkv.server.jobs import CompletionJob

LOG = logging.getLogger("qkv.serve")

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class Histogram:
    """Counts of observations at or below each bucket's upper bound (cumulative when written), their sum."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += count
            le = "+Inf" if math.isinf(bound) else repr(float(bound))
            out.append(f'{name}_bucket{{le="{le}"}} {total}')
        return [*out, f"{name}_sum {self.sum!r}", f"{name}_count {total}"]


class Metrics:
    """The server's numbers. ``gauges`` are read when scraped: name -> (help, function giving the value)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.tokens = 0
        self.requests: dict[str, int] = {"ok": 0, "error": 0, "cancelled": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.gauges: dict[str, tuple[str, Callable[[], float]]] = {}
        self.translations: dict[str, int] = {"ok": 0, "error": 0, "cancelled": 0}
        self.sentences = 0

    def token(self) -> None:
        with self._lock:
            self.tokens += 1

    def request_done(self, job: CompletionJob, status: str, scheduler: str) -> None:
        """Count a finished request, observe its timings and log its one line."""
        end = time.perf_counter()
        usage = job.usage()
        ttft = None if job.first_token is None else job.first_token - job.arrived
        made = usage["completion_tokens"]
        tpot = None
        if job.first_token is not None and job.last_token is not None and made > 1:
            tpot = (job.last_token - job.first_token) / (made - 1)
        with self._lock:
            self.requests[status] = self.requests.get(status, 0) + 1
            if ttft is not None:
                self.ttft.observe(ttft)
            if tpot is not None:
                self.tpot.observe(tpot)
        queued = None if job.started is None else job.started - job.arrived

        def ms(value: float | None) -> str:
            return "-" if value is None else f"{1000 * value:.1f}ms"

        LOG.info(
            "completion %s status=%s scheduler=%s prompt_tokens=%d completion_tokens=%d n=%d queue=%s ttft=%s "
            "tpot=%s total=%s",
            getattr(job, "id", "-"), status, scheduler, usage["prompt_tokens"], made, len(job.choices),
            ms(queued), ms(ttft), ms(tpot), ms(end - job.arrived),
        )  # fmt: skip

    def translation_done(self, status: str, sentences: int, beam: int, scheduler: str, seconds: float) -> None:
        """Count a finished translation request and log its one line."""
        with self._lock:
            self.translations[status] = self.translations.get(status, 0) + 1
            if status == "ok":
                self.sentences += sentences
        LOG.info(
            "translation status=%s scheduler=%s sentences=%d beam=%d total=%.1fms",
            status, scheduler, sentences, beam, 1000 * seconds,
        )  # fmt: skip

    def render(self) -> str:
        """Everything in Prometheus' text format (version 0.0.4)."""
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, values: list[str]) -> None:
            lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *values])

        for name, (help_text, read) in self.gauges.items():
            metric(name, "gauge", help_text, [f"{name} {float(read())!r}"])
        with self._lock:
            metric("qkv_generation_tokens_total", "counter", "Tokens generated.", [
                f"qkv_generation_tokens_total {self.tokens}"])  # fmt: skip
            metric("qkv_requests_total", "counter", "Completion requests finished, by how they ended.", [
                f'qkv_requests_total{{status="{s}"}} {n}' for s, n in sorted(self.requests.items())])  # fmt: skip
            done = sorted(self.translations.items())
            metric("qkv_translation_requests_total", "counter", "Translation requests finished, by how they ended.", [
                f'qkv_translation_requests_total{{status="{s}"}} {n}' for s, n in done])  # fmt: skip
            metric("qkv_translated_sentences_total", "counter", "Sentences translated.", [
                f"qkv_translated_sentences_total {self.sentences}"])  # fmt: skip
            metric("qkv_time_to_first_token_seconds", "histogram",
                   "From a request's arrival to its first generated token (queue and prefill).",
                   self.ttft.lines("qkv_time_to_first_token_seconds"))  # fmt: skip
            metric("qkv_time_per_output_token_seconds", "histogram",
                   "Mean time between a request's generated tokens after the first.",
                   self.tpot.lines("qkv_time_per_output_token_seconds"))  # fmt: skip
        return "\n".join(lines) + "\n"
