"""Hostile clients against `bertforge serve`: every figure of issue #34's "server hardening" against its target.

    PYTHONPATH=. .venv/bin/python bench/serve_hostile.py                  # this checkout's server
    PYTHONPATH=. .venv/bin/python bench/serve_hostile.py --source ../main  # another checkout's server (before/after)
    PYTHONPATH=. .venv/bin/python bench/serve_hostile.py --only big,hangups --soak-seconds 20

The server runs as `bertforge serve` in a subprocess, with its default limits, on a tiny random model built here (2
layers 32 wide, a WordPiece vocabulary of common words and letters, 512 positions: the server reads up to 8,192
characters an input); the clients are threads of this process on the same machine. What it measures:

* big: four 1.9 MB single-string /embed requests at once (without and with "truncate"): each answered within
  15 s; the server's peak memory (VmHWM, reset through /proc/PID/clear_refs, and sampled VmRSS) grows < 600 MB;
* half-open: 300 connections that send part of a head and wait: all closed by the server within 75 s, while a
  normal client is served (every request 200);
* chunked: five 256-input bodies sent chunked (no Content-Length) while /health is asked every 50 ms: p99 < 300 ms;
* hangups: 20 clients that hang up mid-body: no 5xx on /metrics, no traceback in the server's log;
* soak: 8 clients of mixed valid and invalid traffic (the above, malformed JSON, too many inputs, too long
  inputs, /v1/embeddings, /health, /metrics) for 60 s after a 10 s warm-up: no 5xx, the server's memory within
  150 MB and its open files (/proc/PID/fd) within 20 of their values after the warm-up.

Prints one line per figure (measured, target, ok) and the figures as JSON. Timings move with the machine's load:
the load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

SENTENCE = "the movie was good and the plot was not bad , but the film was very long . "
BIG = (SENTENCE * (1_900_000 // len(SENTENCE) + 1))[:1_900_000]  # 1.9 MB in one string
MB = 1024 * 1024


def build_model(directory: Path) -> Path:
    """A tiny random BERT and a WordPiece tokenizer that reads any lowercase English (letters as pieces)."""
    import string

    import torch

    from bertforge import BertConfig, BertModel

    words = sorted(set(SENTENCE.split()) - set(".,?!'") | set("it is this that of to in for with on at as".split()))
    letters = list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *".,?!'", *words, *[t for t in letters if t not in words]]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}), encoding="utf-8")
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(directory)
    return directory


class Server:
    """`bertforge serve` in a subprocess (the code of `source`), its log in a file, its /proc figures."""

    def __init__(self, model: Path, source: Path, log: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        env = dict(os.environ, PYTHONPATH=str(source), PYTHONUNBUFFERED="1")
        where = subprocess.run([sys.executable, "-c", "import bertforge; print(bertforge.__file__)"], cwd=source,
                               env=env, capture_output=True, text=True, check=True).stdout.strip()
        print(f"the server runs {where}")
        self.log = open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "bertforge", "serve", "--model", str(model), "--port",
                                      str(self.port), "--threads", "1", "--max-client-batch-size", "256"],  # the 256-input cases
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env, cwd=source)  # `-m` reads the working directory first
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"the server did not start:\n{log.read_text()}")
            time.sleep(0.2)

    def status(self, field: str) -> int:
        """A /proc/PID/status figure in bytes (VmRSS, VmHWM)."""
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1)) * 1024

    def reset_peak(self) -> None:
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS

    def threads(self) -> int:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"^Threads:\s+(\d+)", text, re.M).group(1))

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def statuses(self) -> dict[tuple[str, int], int]:
        text = httpx.get(self.url + "/metrics", timeout=30).text
        return {(route, int(status)): int(float(n)) for route, status, n in
                re.findall(r'^(?:te_http|bertforge)_requests_total\{route="([^"]+)",status="(\d+)"\} (\S+)$', text, re.M)}

    def errors_since(self, before: dict[tuple[str, int], int]) -> int:
        return sum(n - before.get(key, 0) for key, n in self.statuses().items() if key[1] >= 500)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class PeakMemory:
    """The server's peak resident memory over a `with` block: VmHWM reset at the start, and VmRSS sampled."""

    def __init__(self, server: Server) -> None:
        self.server, self.peak, self.done = server, 0, threading.Event()

    def __enter__(self) -> PeakMemory:
        self.base = self.server.status("VmRSS")
        try:
            self.server.reset_peak()
        except OSError:
            pass
        self.thread = threading.Thread(target=self._sample)
        self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.01):
            self.peak = max(self.peak, self.server.status("VmRSS"))

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, self.server.status("VmHWM"))
        self.growth = self.peak - self.base


def raw(server: Server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def post_chunked(client: httpx.Client, path: str, body: bytes) -> httpx.Response:
    chunks = (body[i: i + 16384] for i in range(0, len(body), 16384))  # a generator: Transfer-Encoding chunked
    return client.post(path, content=chunks, headers={"Content-Type": "application/json"})


def hang_up(server: Server) -> None:
    """A client that sends a head and part of its body, then hangs up."""
    with raw(server) as sock:
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000"
                     b'\r\n\r\n{"inputs": ["' + b"good " * 1000)
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------- the checks
def check_big(server: Server, truncate: bool) -> dict:
    body = {"inputs": BIG, "truncate": True} if truncate else {"inputs": BIG}
    results: list[tuple[int, float]] = []

    def send() -> None:
        start = time.perf_counter()
        with httpx.Client(base_url=server.url, timeout=300) as client:
            status = client.post("/embed", json=body).status_code
        results.append((status, time.perf_counter() - start))

    with PeakMemory(server) as memory:
        threads = [threading.Thread(target=send) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return {"statuses": sorted(s for s, _ in results), "slowest_s": max(t for _, t in results),
            "peak_growth_mb": memory.growth / MB}


def check_half_open(server: Server, n: int = 300, limit: float = 75.0) -> dict:
    selector = selectors.DefaultSelector()
    start = time.monotonic()
    for _ in range(n):
        sock = raw(server)
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-")  # and never the rest
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    time.sleep(0.5)  # the server accepts them
    fds_open = server.fds()
    served, closed_at = [], []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        next_request = 0.0
        while len(closed_at) < n and time.monotonic() - start < limit:
            if time.monotonic() >= next_request:
                served.append(client.post("/embed", json={"inputs": [SENTENCE]}).status_code)
                next_request = time.monotonic() + 0.25
            for key, _ in selector.select(timeout=0.05):
                try:
                    data = key.fileobj.recv(65536)
                except (ConnectionResetError, BlockingIOError):
                    data = b""
                if not data:  # closed by the server (after its 408)
                    selector.unregister(key.fileobj)
                    key.fileobj.close()
                    closed_at.append(time.monotonic() - start)
    for key in list(selector.get_map().values()):
        key.fileobj.close()
    return {"closed": len(closed_at), "last_closed_s": max(closed_at) if closed_at else None,
            "server_fds_while_open": fds_open, "normal_requests": len(served),
            "normal_not_200": sum(s != 200 for s in served)}


def check_chunked(server: Server, rounds: int = 5) -> dict:
    texts = [(SENTENCE * 30)[:2000] for _ in range(256)]  # 256 inputs of 2,000 characters (cut to 512 tokens)
    body = json.dumps({"inputs": texts, "truncate": True}).encode()
    latencies, done, statuses = [], threading.Event(), []

    def probe() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            while not done.is_set():
                start = time.perf_counter()
                client.get("/health")
                latencies.append(time.perf_counter() - start)
                time.sleep(0.05)  # one probe waits out a stall: it must be more than 1% of them to move the p99

    prober = threading.Thread(target=probe)
    prober.start()
    time.sleep(0.3)
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for _ in range(rounds):
            statuses.append(post_chunked(client, "/embed", body).status_code)
    done.set()
    prober.join()
    latencies.sort()
    return {"statuses": statuses, "body_kb": len(body) / 1024, "health_requests": len(latencies),
            "health_p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
            "health_max_ms": 1000 * latencies[-1]}


def check_hangups(server: Server, n: int = 20) -> dict:
    before, log_before = server.statuses(), len(server.log_text())
    threads = [threading.Thread(target=hang_up, args=(server,)) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(1.0)
    counted = {k: v - before.get(k, 0) for k, v in server.statuses().items() if k[0] == "/embed"}
    return {"5xx": server.errors_since(before), "tracebacks": server.log_text()[log_before:].count("Traceback"),
            "counted": {str(k[1]): v for k, v in counted.items() if v}}


#: The soak's mix: what each of its clients picks from, at random, request after request.
SOAK_MIX = ["embed"] * 6 + ["openai"] * 3 + ["health", "metrics", "bad_json", "too_many", "too_long", "big", "chunked",
                                            "hang_up", "half_open"]


def soak_client(server: Server, seed: int, stop: threading.Event, tally: dict, actions: list[str]) -> None:
    rng = random.Random(seed)
    chunked_body = json.dumps({"inputs": [(SENTENCE * 8)[:500]] * 256, "truncate": True}).encode()
    half_open: list[socket.socket] = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        while not stop.is_set():
            action = rng.choice(actions)
            try:
                if action == "embed":
                    r = client.post("/embed", json={"inputs": [SENTENCE] * rng.randint(1, 8)})
                elif action == "openai":
                    r = client.post("/v1/embeddings", json={"input": SENTENCE, "model": "m"})
                elif action in ("health", "metrics"):
                    r = client.get("/" + action)
                elif action == "bad_json":
                    r = client.post("/embed", content=b'{"inputs": [', headers={"Content-Type": "application/json"})
                elif action == "too_many":
                    r = client.post("/embed", json={"inputs": ["a"] * 300})
                elif action == "too_long":
                    r = client.post("/embed", json={"inputs": SENTENCE * 40})
                elif action == "big":
                    r = client.post("/embed", json={"inputs": BIG})
                elif action == "chunked":
                    r = post_chunked(client, "/embed", chunked_body)
                elif action == "hang_up":
                    hang_up(server)
                    r = None
                else:  # a head left half sent; the server must close it (checked, and closed here, later)
                    sock = raw(server)
                    sock.sendall(b"GET /health HTTP/1.1\r\nHo")
                    sock.setblocking(False)
                    half_open.append(sock)
                    r = None
            except httpx.HTTPError as err:
                tally.setdefault("client_errors", []).append(f"{action}: {type(err).__name__}")
                continue
            if r is not None:
                tally.setdefault(r.status_code, 0)
                tally[r.status_code] += 1
            for sock in list(half_open):
                try:
                    if sock.recv(65536) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    continue
                except (ConnectionResetError, OSError):
                    pass
                sock.close()
                half_open.remove(sock)
    for sock in half_open:
        sock.close()


def check_soak(server: Server, seconds: float, mix: list[str], warmup: float = 10.0, clients: int = 8) -> dict:
    stop, tallies = threading.Event(), [dict() for _ in range(clients)]
    threads = [threading.Thread(target=soak_client, args=(server, i, stop, tallies[i], mix)) for i in range(clients)]
    log_before = len(server.log_text())
    for t in threads:
        t.start()
    time.sleep(warmup)
    warm_rss, warm_fds, before = server.status("VmRSS"), server.fds(), server.statuses()
    warm_threads = server.threads()
    rss, fds = [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rss.append(server.status("VmRSS"))
        fds.append(server.fds())
        time.sleep(0.2)
    final_rss, final_fds, errors = server.status("VmRSS"), server.fds(), server.errors_since(before)
    threads_now = server.threads()
    stop.set()
    for t in threads:
        t.join()
    answered: dict[str, int] = {}
    for tally in tallies:
        for key, n in tally.items():
            if isinstance(key, int):
                answered[str(key)] = answered.get(str(key), 0) + n
    return {"5xx": errors, "tracebacks": server.log_text()[log_before:].count("Traceback"), "answered": answered,
            "client_errors": sum(len(t.get("client_errors", [])) for t in tallies),
            "warm_rss_mb": warm_rss / MB, "rss_growth_mb": (final_rss - warm_rss) / MB,
            "rss_max_growth_mb": (max(rss) - warm_rss) / MB, "warm_fds": warm_fds,
            "rss_every_10s_mb": [round((r - warm_rss) / MB) for r in rss[::50]],
            "fds_growth": final_fds - warm_fds, "fds_max_growth": max(fds) - warm_fds,
            "threads_warm_end": [warm_threads, threads_now]}


# ---------------------------------------------------------------------------------------------- report
def verdicts(figures: dict) -> list[tuple[str, str, str, bool]]:
    rows = []
    for name in ("big", "big_truncate"):
        if name in figures:
            f = figures[name]
            rows.append((f"{name}: slowest of 4 x 1.9 MB answers", f"{f['slowest_s']:.1f} s {f['statuses']}",
                         "< 15 s", f["slowest_s"] < 15))
            rows.append((f"{name}: peak memory growth", f"{f['peak_growth_mb']:.0f} MB", "< 600 MB",
                         f["peak_growth_mb"] < 600))
    if "half_open" in figures:
        f = figures["half_open"]
        last = f["last_closed_s"]
        rows.append(("half-open: 300 closed by the server", f"{f['closed']} by {last and round(last, 1)} s",
                     "300 within 75 s", f["closed"] == 300))
        rows.append(("half-open: normal client meanwhile", f"{f['normal_requests'] - f['normal_not_200']}/"
                     f"{f['normal_requests']} answered 200", "all 200", f["normal_not_200"] == 0))
    if "chunked" in figures:
        f = figures["chunked"]
        rows.append(("chunked 256-input bodies: /health p99", f"{f['health_p99_ms']:.0f} ms (max "
                     f"{f['health_max_ms']:.0f})", "< 300 ms", f["health_p99_ms"] < 300))
    if "hangups" in figures:
        f = figures["hangups"]
        rows.append(("20 hang-ups mid-body: 5xx, tracebacks", f"{f['5xx']}, {f['tracebacks']}", "0, 0",
                     f["5xx"] == 0 and f["tracebacks"] == 0))
    if "soak" in figures:
        f = figures["soak"]
        rows.append(("soak: 5xx, tracebacks", f"{f['5xx']}, {f['tracebacks']}", "0, 0",
                     f["5xx"] == 0 and f["tracebacks"] == 0))
        rows.append(("soak: memory against warm-up", f"{f['rss_growth_mb']:+.0f} MB (max "
                     f"{f['rss_max_growth_mb']:+.0f})", "within 150 MB", abs(f["rss_growth_mb"]) <= 150))
        rows.append(("soak: open files against warm-up", f"{f['fds_growth']:+d} (max {f['fds_max_growth']:+d})",
                     "within 20", abs(f["fds_growth"]) <= 20))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout whose bertforge the server runs (default: this one)")
    parser.add_argument("--only", default="big,half_open,chunked,hangups,soak", help="checks to run, comma-separated")
    parser.add_argument("--soak-seconds", type=float, default=60.0)
    parser.add_argument("--soak-mix", default=",".join(sorted(set(SOAK_MIX))),
                        help="the soak's kinds of request (default: all of them, valid ones weighted up)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    kinds = args.soak_mix.split(",")
    if set(kinds) - set(SOAK_MIX):
        parser.error(f"--soak-mix: unknown kinds {sorted(set(kinds) - set(SOAK_MIX))}; known: {sorted(set(SOAK_MIX))}")
    mix = SOAK_MIX if set(kinds) == set(SOAK_MIX) else kinds
    print(f"load average at the start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; server from {args.source}")
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(build_model(Path(tmp) / "model"), args.source.resolve(), Path(tmp) / "server.log")
        figures: dict = {}
        try:
            checks = [("big", lambda: check_big(server, False)), ("big_truncate", lambda: check_big(server, True)),
                      ("half_open", lambda: check_half_open(server)), ("chunked", lambda: check_chunked(server)),
                      ("hangups", lambda: check_hangups(server)),
                      ("soak", lambda: check_soak(server, args.soak_seconds, mix))]
            for name, check in checks:
                if name in only or (name == "big_truncate" and "big" in only):
                    start = time.monotonic()
                    figures[name] = check()
                    print(f"{name}: {json.dumps(figures[name])} ({time.monotonic() - start:.0f} s)", flush=True)
        finally:
            server.stop()
    print(f"load average at the end: {os.getloadavg()[0]:.1f}\n")
    print("| figure | measured | target | ok |\n| --- | --- | --- | --- |")
    for name, measured, target, ok in verdicts(figures):
        print(f"| {name} | {measured} | {target} | {'yes' if ok else 'NO'} |")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
