"""Continuous batching (qkv.decoding.batcher): every sequence's tokens equal its solo run with
:func:`qkv.decoding.generate`, whatever its neighbours, when it joined, and whoever left."""

from __future__ import annotations

import pytest
import torch

from qkv import GPT, GPTConfig
from qkv.decoding import generate
from qkv.decoding.batcher import Batcher, Sequence

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread is fastest


def tiny(kind: str = "gpt") -> GPT:
    torch.manual_seed(0)
    if kind == "llama":
        from qkv.models import LlamaConfig
        from qkv.models.llama import Llama

        config = LlamaConfig(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=48,
                             context_length=24, init_std=0.5)  # fmt: skip
        return Llama(config).eval()
    return GPT(GPTConfig(vocab_size=50, d_model=32, n_heads=4, n_layers=2, context_length=24, init_std=0.5)).eval()


class Collect(Sequence):
    """A sequence that keeps its tokens; ``fail_at`` makes its emit raise at that token (a bad request)."""

    def __init__(self, prompt, *, fail_at: int | None = None, seed: int | None = None, **settings) -> None:
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        super().__init__(prompt, generator=generator, **settings)
        self.out: list[int] = []
        self.fail_at, self.done, self.error, self.gone = fail_at, False, None, False

    def emit(self, token: int, logits: torch.Tensor) -> bool:
        if self.fail_at is not None and len(self.out) == self.fail_at:
            raise ValueError("bad request")
        self.out.append(token)
        return True

    def finish(self) -> None:
        self.done = True

    def fail(self, error: Exception) -> None:
        self.error = error

    def cancelled(self) -> bool:
        return self.gone


def solo(model: GPT, s: Collect, seed: int | None = None) -> list[int]:
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    out = generate(model, s.prompt, max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                   top_p=s.top_p, eos_id=s.eos_id, generator=generator)  # fmt: skip
    return out[0, len(s.prompt) :].tolist()


def run(batcher: Batcher, arrivals: dict[int, list[Collect]], steps: int = 100, together: bool = False) -> None:
    """Add each step's arrivals (as rows free up; ``together``: all that fit in one prefill), then step, until
    everything has left."""
    waiting: list[Collect] = []
    for t in range(steps):
        waiting += arrivals.get(t, [])
        if together and waiting and batcher.free:
            joining, waiting = waiting[: batcher.free], waiting[batcher.free :]
            batcher.add_all(joining)
        while waiting and batcher.free:
            batcher.add(waiting.pop(0))
        if not batcher.running and not waiting and t > max(arrivals):
            return
        batcher.drop_cancelled()
        batcher.step()


@pytest.mark.parametrize("together", [False, True], ids=["one-by-one", "prefilled-together"])
@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_greedy_and_seeded_sequences_joining_at_different_steps_equal_their_solo_runs(kind: str, together) -> None:
    model = tiny(kind)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(50, (n,), generator=g).tolist() for n in (3, 9, 1, 14, 6, 5)]
    settings = [
        dict(temperature=0),
        dict(temperature=0.9, seed=5),
        dict(temperature=1.2, top_k=5, seed=6),
        dict(temperature=0),
        dict(temperature=0.8, top_p=0.8, seed=7),
        dict(temperature=0, eos_id=3),
    ]
    sequences = [Collect(p, max_new_tokens=8 + i, **s) for i, (p, s) in enumerate(zip(prompts, settings, strict=True))]
    arrivals = {0: sequences[:2], 2: sequences[2:4], 5: sequences[4:]}
    run(Batcher(model, slots=3, max_len=24), arrivals, together=together)
    for s, setting in zip(sequences, settings, strict=True):
        assert s.done and s.error is None
        assert s.out == solo(model, s, setting.get("seed"))


def test_a_seeded_sequence_draws_the_same_tokens_whatever_its_neighbours() -> None:
    model = tiny()
    texts = []
    for neighbours in (0, 1, 3):
        mine = Collect([1, 2, 3], max_new_tokens=12, temperature=1.0, seed=42)
        others = [Collect([4 + i] * (2 + i), max_new_tokens=5 + i, temperature=1.5, seed=i) for i in range(neighbours)]
        run(Batcher(model, slots=4, max_len=24), {0: others, 1: [mine]})
        texts.append(mine.out)
    assert texts[0] == texts[1] == texts[2] == solo(model, mine, 42)


def test_past_the_context_the_window_slides_as_in_generate() -> None:
    model = tiny()
    long = Collect(list(range(20)), max_new_tokens=10, temperature=0)  # 20 + 10 > context 24
    short = Collect([7, 8], max_new_tokens=12, temperature=0)
    run(Batcher(model, slots=2, max_len=24), {0: [long, short]})
    assert long.out == solo(model, long) and short.out == solo(model, short)


def test_a_failing_sequence_leaves_alone_and_a_cancelled_one_frees_its_row_at_the_next_step() -> None:
    model = tiny()
    bad = Collect([5, 6, 7], max_new_tokens=10, temperature=0, fail_at=3)
    gone = Collect([9, 9], max_new_tokens=50, temperature=0)
    good = Collect([1, 2], max_new_tokens=10, temperature=0)
    batcher = Batcher(model, slots=3, max_len=24)
    for s in (bad, gone, good):
        batcher.add(s)
    for _ in range(4):
        batcher.step()
    assert isinstance(bad.error, ValueError) and bad not in batcher.running and len(bad.out) == 3
    gone.gone = True
    assert batcher.drop_cancelled() == 1 and batcher.running == [good] and batcher.free == 2
    while batcher.running:
        batcher.step()
    assert good.done and good.out == solo(model, good)
    assert gone.done and gone.error is None  # it left as cancelled: finish(), no error
