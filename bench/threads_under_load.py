"""The main job (`qkv train`, no flags) beside one CPU-bound process: 1 thread, 2 threads and the default.

Issue 23: with another process using the CPU, the README's main job took over 10 minutes with torch's two
threads and 4:08 with `--threads 1`. Torch's threads meet at a barrier after every parallel op; when one of
them shares its core with the other process it gets a turn only every few milliseconds, and the rest spin
(OpenMP's wait policy) until it does, so every step waits on the scheduler. The default now counts the cores
other processes keep busy when training starts (qkv.training.device.default_threads) and uses the idle ones.

Each trial is a fresh process (OpenMP's pool is made once per process) that trains the main job's model on
the main job's data for --steps steps and reports the seconds per step after the first; the three settings
run interleaved, --rounds times, while one `while True: pass` process runs beside them. Printed: the median
seconds per step of each setting, default / best of (1, 2) (the target: at most 1.5), and the load average.

    python bench/threads_under_load.py                  # 3 rounds of 40 steps each
    python bench/threads_under_load.py --no-competitor  # the same on a quiet machine
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
SETTINGS = {"1 thread": "1", "2 threads": "2", "default": "none"}


def worker(threads: str, steps: int) -> None:
    """Train the main job for ``steps`` steps; print the seconds per step after the first."""
    from qkv.training.config import TrainConfig
    from qkv.training.tasks.language_model import train_language_model

    times: list[float] = []

    def tick(trainer, step, loss) -> None:  # noqa: ARG001
        times.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig.create(
            out_dir=str(Path(out) / "run"), steps=steps, eval_interval=10 * steps, checkpoint_interval=10 * steps,
            threads=None if threads == "none" else int(threads),
        )  # fmt: skip
        train_language_model(config, quiet=True, on_step=tick)
    import torch

    print(f"{(times[-1] - times[0]) / (len(times) - 1):.5f} {torch.get_num_threads()}")


def trial(threads: str, steps: int) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run(
        [sys.executable, __file__, "--worker", threads, "--steps", str(steps)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    seconds, used = done.stdout.split()[-2:]
    return float(seconds), int(used)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-competitor", action="store_true", help="no CPU-bound process beside the job")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return
    competitor = None
    if not args.no_competitor:
        competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(1.0)  # running before the default counts busy cores
    results: dict[str, list[float]] = {name: [] for name in SETTINGS}
    used: dict[str, int] = {}
    try:
        for round_ in range(args.rounds):
            for name, threads in SETTINGS.items():
                seconds, used[name] = trial(threads, args.steps)
                results[name].append(seconds)
                print(f"round {round_ + 1}: {name:<9} {1000 * seconds:7.1f} ms/step ({used[name]} threads)", flush=True)
    finally:
        if competitor is not None:
            competitor.kill()
    median = {name: statistics.median(values) for name, values in results.items()}
    best = min(median["1 thread"], median["2 threads"])
    print(f"\ncores: {os.cpu_count()}; one CPU-bound process beside: {competitor is not None}; "
          f"load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    for name, value in median.items():
        print(f"{name:<9} {1000 * value:7.1f} ms/step (median of {args.rounds})  x{value / best:.2f} of the best")
    print(f"default / best of 1 and 2 threads: {median['default'] / best:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
