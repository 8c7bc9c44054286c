"""Helpers of the serve tests: tiny random models saved with save_pretrained, and `ThreadServer`, a real uvicorn
server in a thread of the test process, on a free localhost port, with a real HTTP client (httpx). Every request
has a timeout. (The command tests, `tests/commands/test_serve.py`, use the models and start `bertforge serve` in
its own process.)"""

from __future__ import annotations

import logging
import re
import socket
import string
import threading
import time
from pathlib import Path

import torch

from bertforge import BertForMaskedLM, BertForSequenceClassification, BertModel
from bertforge.serve import Engine, ServeConfig, create_app
from tests.helpers import SPECIALS, tiny_config, write_uncased_tokenizer

TIMEOUT = 15.0
DEADLINE = 0.5  # the head and body timeouts of the `guarded_server` fixture, in seconds
WORDS = "the is was not very good great fun bad awful movie film plot this it and of".split()
SENTENCES = ["the movie was good", "bad", "a very very boring plot , not fun at all", "", "great film !",
             "it was awful and the plot was bad"]
LONG = "the movie was good and " * 20  # 102 tokens: past the tiny models' 64 positions


def _vocabulary() -> list[str]:
    letters = list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase]
    return [*SPECIALS, *".,?!", *WORDS, *[t for t in letters if t not in WORDS]]


def _save(directory: Path, cls: type, **labels) -> Path:
    vocab = _vocabulary()
    write_uncased_tokenizer(directory, vocab)
    config = tiny_config(vocab_size=len(vocab), **labels)
    torch.manual_seed(0)
    model = cls(config)
    if cls is BertForSequenceClassification:
        with torch.no_grad():
            model.classifier.weight.normal_(0.0, 2.0)  # confident, varied scores rather than ~0.5 everywhere
    model.save_pretrained(directory)
    return directory


def save_models(root: Path) -> dict[str, Path]:
    """The embedding, classification and MLM models under `root` (also the fixture of the command tests, `tests/commands/test_serve.py`)."""
    return {
        "embed": _save(root / "embed", BertModel),
        "classify": _save(root / "classify", BertForSequenceClassification, id2label={0: "neg", 1: "pos"},
                          label2id={"neg": 0, "pos": 1}),
        "mlm": _save(root / "mlm", BertForMaskedLM),  # an MLM head: /embed_sparse (SPLADE) with --pooling splade
        # one label: a cross-encoder, TEI's "reranker" (/rerank, and POST / is /rerank)
        "rerank": _save(root / "rerank", BertForSequenceClassification, id2label={0: "LABEL_0"},
                        label2id={"LABEL_0": 0}),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThreadServer:
    """uvicorn serving `create_app` in a thread of this process, on a socket bound to a free port, with the
    connection limits `bertforge serve` sets (on uvicorn's HTTP protocol, or on `protocol`)."""

    def __init__(self, config: ServeConfig, protocol: type | None = None) -> None:
        import uvicorn  # imported here: the tests that start a server skip themselves without it

        from bertforge.serve.connections import GuardedProtocol, protocol_options

        self.engine = Engine(config)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        app = create_app(engine=self.engine)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                                    **protocol_options(config, protocol or GuardedProtocol)))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ThreadServer:
        import httpx

        self.thread.start()
        deadline = time.monotonic() + TIMEOUT
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        self.client = httpx.Client(base_url=self.url, timeout=TIMEOUT)
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(TIMEOUT)
        self.sock.close()
        assert not self.thread.is_alive(), "the server did not stop"


def block_worker(engine: Engine, kind: str = "embed") -> tuple[threading.Event, threading.Event]:
    """Make the worker wait inside its next pipeline call until `release` is set; `entered` tells it is there."""
    entered, release = threading.Event(), threading.Event()
    runner = engine.batcher.runners[kind]

    def blocked(items, features):
        entered.set()
        assert release.wait(TIMEOUT), "never released"
        return runner(items, features)

    engine.batcher.runners[kind] = blocked
    return entered, release


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus text page: `name` with exactly `labels`, in any order."""
    found = [value for sample, sample_labels, value in samples(text) if sample == name and sample_labels == labels]
    assert len(found) == 1, f"{name}{labels} not on the metrics page"
    return found[0]


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text page: (name, labels, value)."""
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)', line)
            assert m, f"not a sample line: {line!r}"
            out.append((m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")), float(m.group(3))))
    return out


def connect(s: ThreadServer) -> socket.socket:
    """A raw TCP connection to the server (for heads and bodies no HTTP client would send)."""
    host, port = s.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=TIMEOUT)


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    start, data = time.monotonic(), b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:  # closed with bytes of ours unread
        pass
    return data, time.monotonic() - start


class LogRecords(logging.Handler):
    """The records of the server's loggers (uvicorn's do not propagate to pytest's caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> LogRecords:
        for name in ("bertforge", "uvicorn.error"):
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        for name in ("bertforge", "uvicorn.error"):
            logging.getLogger(name).removeHandler(self)


def statuses(s: ThreadServer, route: str) -> dict[int, float]:
    """The requests of `route` counted on /metrics, by status."""
    return {int(labels["status"]): value for name, labels, value in samples(s.client.get("/metrics").text)
            if name == "te_http_requests_total" and labels["route"] == route}
