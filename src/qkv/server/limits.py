"""What one request may ask for and how many run at once (the ``qkv serve`` flags), and the gate that holds
requests beyond that: they wait up to ``--queue-timeout`` seconds, then are refused with 503 rather than piling up."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from qkv.server.errors import ServiceError


@dataclass
class Limits:
    """What one request may ask for, and how many generations run at once (the ``qkv serve`` flags)."""

    max_prompt_tokens: int = 1024  # longer prompts (or texts, or source sentences) get 413
    max_tokens: int = 512  # a larger max_tokens gets 400
    max_concurrent: int = 2  # generations at once; others wait up to queue_timeout seconds, then get 503
    queue_timeout: float = 10.0
    max_n: int = 8  # completions per prompt (n)
    max_logprobs: int = 5  # top alternatives per token (logprobs), as OpenAI
    max_request_bytes: int = 1_048_576  # a larger body gets 413 before it is read
    max_batch: int = 16  # rows of the batched scheduler's KV cache pool (sequences decoded together)
    kv_tokens: int = 0  # the pool's bound in cache positions (0: none beyond max_batch)
    kv_memory_mb: float = 0.0  # the pool's bound in MiB (0: none beyond max_batch)
    prompt_lookup: int = 0  # greedy requests draft up to this many tokens a step from their text (0: none)

    def __post_init__(self) -> None:
        for name in ("max_prompt_tokens", "max_tokens", "max_concurrent", "max_n", "max_request_bytes", "max_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("kv_tokens", "kv_memory_mb"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0 (0: no bound), got {getattr(self, name)}")
        if self.prompt_lookup < 0:
            raise ValueError(f"prompt_lookup must be >= 0 drafted tokens a step (0: none), got {self.prompt_lookup}")
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be >= 0, got {self.max_logprobs}")
        if not self.queue_timeout >= 0:
            raise ValueError(f"queue_timeout must be >= 0 seconds, got {self.queue_timeout}")


class Gate:
    """At most ``slots`` holders at once. :meth:`enter` waits up to ``timeout`` seconds, then raises 503.

    Used from the event loop only (an asyncio semaphore); the work it guards runs in threads.
    """

    def __init__(self, slots: int, timeout: float, what: str) -> None:
        self.slots, self.timeout, self.what = slots, timeout, what
        self.active = self.waiting = 0
        self._semaphore = asyncio.Semaphore(slots)

    async def enter(self) -> None:
        self.waiting += 1
        try:
            async with asyncio.timeout(self.timeout):
                await self._semaphore.acquire()
        except TimeoutError:
            raise ServiceError(
                503,
                f"the server is busy: {self.active} {self.what} running (at most {self.slots} at once, "
                f"--max-concurrent) and none finished within {self.timeout:g} s; try again shortly",
                kind="server_busy",
                code="server_busy",
                headers={"Retry-After": "1"},
            ) from None
        finally:
            self.waiting -= 1
        self.active += 1

    def leave(self) -> None:
        self.active -= 1
        self._semaphore.release()
