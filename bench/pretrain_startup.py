"""How fast pretraining starts on a multi-GB corpus, and how much memory it holds.

Writes a corpus of --gb gigabytes (real text from ../shared/data, documents shuffled and repeated) to a temporary
directory, then runs `bertforge pretrain` on it as a child process and prints: seconds until the first optimizer
step is logged, and the child's peak resident memory. The tokenizer is trained once on a small sample first (as a
user would with `bertforge train-tokenizer`), and separately the time to train one on --tokenizer-sample-mb of the
big corpus is reported.

    python bench/pretrain_startup.py --gb 3
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "corpora"


def source_documents() -> list[str]:
    docs = []
    for file in sorted(SHARED.rglob("*.txt")):
        text = file.read_text(encoding="latin-1")
        for block in text.split("\n\n"):
            lines = [line.strip() for line in block.splitlines() if line.strip()]
            if len(lines) >= 2:
                docs.append("\n".join(lines))
    return docs


def write_corpus(path: Path, gigabytes: float, seed: int = 0) -> int:
    docs = source_documents()
    rng = random.Random(seed)
    target = int(gigabytes * 1e9)
    written = 0
    with open(path, "w", encoding="utf-8") as fh:
        while written < target:
            rng.shuffle(docs)
            for doc in docs:
                fh.write(doc + "\n\n")
                written += len(doc) + 2
                if written >= target:
                    break
    return written


def high_water_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM) from /proc, in kB; 0 once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=3.0)
    p.add_argument("--config", default="mini", help="model size; the corpus side of memory is what this measures")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tokenizer-sample-mb", type=float, default=64)
    p.add_argument("--workdir", default=None, help="where to write the corpus (default: a temporary directory)")
    args = p.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bertforge-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.txt"
    t = time.perf_counter()
    if corpus.exists() and abs(corpus.stat().st_size - args.gb * 1e9) < 0.01 * args.gb * 1e9:
        print(f"corpus: reusing {corpus} ({corpus.stat().st_size / 1e9:.2f} GB)")
    else:
        size = write_corpus(corpus, args.gb)
        print(f"corpus: {size / 1e9:.2f} GB written in {time.perf_counter() - t:.0f} s ({corpus})")

    bf = [sys.executable, "-m", "bertforge"]
    t = time.perf_counter()
    subprocess.run(bf + ["train-tokenizer", "--corpus", str(corpus), "--vocab-size", "30522", "--out", str(work / "tok"),
                         "--sample-mb", str(args.tokenizer_sample_mb)], check=True, capture_output=True, timeout=3600)
    print(f"train-tokenizer on the first {args.tokenizer_sample_mb:g} MB: {time.perf_counter() - t:.0f} s")

    out = work / "run"
    shutil.rmtree(out, ignore_errors=True)  # so that metrics.jsonl appears only with this run's first step
    cmd = bf + ["pretrain", "--corpus", str(corpus), "--tokenizer", str(work / "tok"), "--config", args.config,
                "--max-steps", str(args.steps), "--log-every", "1", "--save-every", str(10**6), "--batch-size", "8",
                "--out", str(out), "--no-progress"]
    t = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first_step, peak_kb = None, 0
    metrics = out / "metrics.jsonl"
    while child.poll() is None:
        if first_step is None and metrics.exists() and metrics.stat().st_size > 0:
            first_step = time.perf_counter() - t
        peak_kb = max(peak_kb, high_water_kb(child.pid))
        time.sleep(0.2)
    total = time.perf_counter() - t
    if child.returncode:
        sys.exit(f"pretrain failed:\n{child.stderr.read()[-2000:]}")
    peak_mb = peak_kb / 1024
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    print(f"pretrain --config {args.config}: first step logged after {first_step:.1f} s, {args.steps} steps in {total:.1f} s, "
          f"loss {rows[0]['loss']:.2f} -> {rows[-1]['loss']:.2f}")
    print(f"peak resident memory of the pretraining process: {peak_mb:,.0f} MB")


if __name__ == "__main__":
    main()
