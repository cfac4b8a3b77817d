"""Draw a run's loss curve (training and validation loss per step) to RUN_DIR/loss.png."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `qkv train`")
    parser.add_argument("--out", help="where to write the PNG (default RUN_DIR/loss.png)")


def run(args: argparse.Namespace) -> int:
    from qkv.training.plot import plot_losses

    print(plot_losses(args.run_dir, args.out))
    return 0
