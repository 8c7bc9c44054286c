"""`bertforge.serve`: a real uvicorn server on a free localhost port, a real HTTP client (httpx, the `openai`
client, http.client), tiny random models saved with save_pretrained. Every request has a timeout. (The command,
`bertforge serve`, in its own process: tests/commands/test_serve.py.)"""

from __future__ import annotations

import base64
import json
import re
import socket
import string
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertForSequenceClassification, BertModel
from bertforge.serve import Engine, ServeConfig, create_app
from tests.helpers import SPECIALS, tiny_config, write_uncased_tokenizer

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")

TIMEOUT = 15.0
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


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    return save_models(tmp_path_factory.mktemp("serve_models"))


def save_models(root: Path) -> dict[str, Path]:
    """`models` under `root` (also the fixture of the command tests, `tests/commands/test_serve.py`)."""
    return {
        "embed": _save(root / "embed", BertModel),
        "classify": _save(root / "classify", BertForSequenceClassification, id2label={0: "neg", 1: "pos"},
                          label2id={"neg": 0, "pos": 1}),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThreadServer:
    """uvicorn serving `create_app` in a thread of this process, on a socket bound to a free port."""

    def __init__(self, config: ServeConfig) -> None:
        self.engine = Engine(config)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        app = create_app(engine=self.engine)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ThreadServer:
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


@pytest.fixture(scope="module")
def embed_server(models):
    with ThreadServer(ServeConfig(model=str(models["embed"]), max_client_batch_size=8, max_body_bytes=4096)) as s:
        yield s


@pytest.fixture(scope="module")
def classify_server(models):
    with ThreadServer(ServeConfig(model=str(models["classify"]))) as s:
        yield s


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
    """The value of one sample of a Prometheus text page."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}{re.escape('{' + want + '}') if want else ''} (\S+)$"
    found = re.findall(pattern, text, flags=re.M)
    assert len(found) == 1, f"{name}{{{want}}} not on the metrics page"
    return float(found[0])


# ------------------------------------------------------------------------------------------------- embeddings
def test_embed_returns_the_pipelines_vectors(embed_server, models):
    pipe = bertforge.pipeline("embed", model=models["embed"], normalize=True)
    raw = bertforge.pipeline("embed", model=models["embed"], normalize=False)
    r = embed_server.client.post("/embed", json={"inputs": SENTENCES})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    np.testing.assert_allclose(np.array(r.json(), dtype=np.float32), pipe(SENTENCES), rtol=0, atol=1e-5)
    r = embed_server.client.post("/embed", json={"inputs": SENTENCES[0], "normalize": False})
    assert len(r.json()) == 1  # one string: still a list of vectors, as text-embeddings-inference answers
    np.testing.assert_allclose(np.array(r.json()[0], dtype=np.float32), raw(SENTENCES[0]), rtol=0, atol=1e-5)
    assert abs(np.linalg.norm(r.json()[0]) - 1) > 1e-3  # really not normalised


def test_truncate(embed_server, models):
    r = embed_server.client.post("/embed", json={"inputs": ["good", LONG]})
    assert r.status_code == 413 and "input 1 has 102 tokens" in r.json()["error"]
    r = embed_server.client.post("/embed", json={"inputs": ["good", LONG], "truncate": True})
    assert r.status_code == 200
    pipe = bertforge.pipeline("embed", model=models["embed"], normalize=True)
    np.testing.assert_allclose(np.array(r.json(), dtype=np.float32), pipe(["good", LONG]), rtol=0, atol=1e-5)


def test_openai_embeddings(embed_server, models):
    pipe = bertforge.pipeline("embed", model=models["embed"])  # this model declares no normalisation
    r = embed_server.client.post("/v1/embeddings", json={"input": SENTENCES[:3], "model": "anything"})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and body["model"] == "embed"
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and {d["object"] for d in body["data"]} == {"embedding"}
    np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]], dtype=np.float32),
                               pipe(SENTENCES[:3]), rtol=0, atol=1e-5)
    tokens = sum(len(ids) for ids in pipe.tokenizer(SENTENCES[:3])["input_ids"])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}

    r = embed_server.client.post("/v1/embeddings", json={"input": "good", "encoding_format": "base64",
                                                         "dimensions": 8})
    row = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(row, pipe("good")[:8], rtol=0, atol=1e-5)


def test_the_openai_client_works_unchanged(embed_server, models):
    openai = pytest.importorskip("openai", reason="needs openai: pip install -e '.[test]'")
    client = openai.OpenAI(base_url=embed_server.url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)
    result = client.embeddings.create(input=SENTENCES[:2], model="embed")  # the client asks for base64 by default
    pipe = bertforge.pipeline("embed", model=models["embed"])
    np.testing.assert_allclose(np.array([d.embedding for d in result.data], dtype=np.float32), pipe(SENTENCES[:2]),
                               rtol=0, atol=1e-5)
    assert result.usage.prompt_tokens > 0
    with pytest.raises(openai.UnprocessableEntityError, match="empty array"):  # our 4xx errors reach its exceptions
        client.embeddings.create(input=[], model="embed")


# ------------------------------------------------------------------------------------------------- classification
def test_predict_and_rerank(classify_server, models):
    probs = bertforge.pipeline("text-classification", model=models["classify"], top_k=None)
    logits = bertforge.pipeline("text-classification", model=models["classify"], top_k=None, function_to_apply="none")
    client = classify_server.client

    def close(got, want):
        assert [x["label"] for x in got] == [x["label"] for x in want]
        np.testing.assert_allclose([x["score"] for x in got], [x["score"] for x in want], rtol=0, atol=1e-5)

    r = client.post("/predict", json={"inputs": "the movie was good"})
    assert r.status_code == 200
    close(r.json(), probs("the movie was good"))
    r = client.post("/predict", json={"inputs": ["bad", ["the film", "was great"]], "raw_scores": True})
    for got, want in zip(r.json(), logits(["bad", ("the film", "was great")]), strict=True):
        close(got, want)

    texts = ["great fun", "awful", "the plot", "good good good", "bad movie"]
    r = client.post("/rerank", json={"query": "is it good ?", "texts": texts, "return_text": True})
    assert r.status_code == 200
    ranked = r.json()
    want = [next(x["score"] for x in labels if x["label"] == "pos")
            for labels in probs([("is it good ?", t) for t in texts])]
    assert sorted(e["index"] for e in ranked) == list(range(len(texts)))
    assert [e["index"] for e in ranked] == sorted(range(len(texts)), key=lambda i: -want[i])
    for e in ranked:
        assert e["text"] == texts[e["index"]] and abs(e["score"] - want[e["index"]]) < 1e-5
    assert len(set(round(w, 3) for w in want)) > 1  # the order means something

    # /rerank is the rerank pipeline's ranking (raw_scores: its logits), 413 past the model's length unless truncated
    rerank = bertforge.pipeline("rerank", model=models["classify"], activation="none")
    r = client.post("/rerank", json={"query": "is it good ?", "texts": texts, "raw_scores": True})
    want = rerank("is it good ?", texts)
    assert [e["index"] for e in r.json()] == [e["corpus_id"] for e in want]
    np.testing.assert_allclose([e["score"] for e in r.json()], [e["score"] for e in want], rtol=0, atol=1e-5)
    r = client.post("/rerank", json={"query": "is it good ?", "texts": ["good", LONG]})
    assert r.status_code == 413 and "input 1 has 107 tokens" in r.json()["error"]
    r = client.post("/rerank", json={"query": "is it good ?", "texts": ["good", LONG], "truncate": True})
    assert r.status_code == 200 and sorted(e["index"] for e in r.json()) == [0, 1]

    # each server serves its own kind of model, and says so
    r = client.post("/embed", json={"inputs": "x"})
    assert r.status_code == 400 and "embedding model" in r.json()["error"]


def test_each_request_is_tokenized_once(embed_server, monkeypatch):
    pipe = embed_server.engine.pipelines["embed"]
    calls = []

    def featurize(inputs):
        calls.append(list(inputs))
        return type(pipe).featurize(pipe, inputs)

    monkeypatch.setattr(pipe, "featurize", featurize)
    r = embed_server.client.post("/embed", json={"inputs": SENTENCES[:3]})
    assert r.status_code == 200 and len(r.json()) == 3
    assert calls == [SENTENCES[:3]]  # on arrival (to count its tokens); the worker only packs and computes


def test_json_floats_read_back_as_the_same_float32():
    from bertforge.serve import _json_floats

    rng = np.random.default_rng(0)
    rows = np.concatenate([
        rng.standard_normal((64, 96)) * 10.0 ** rng.integers(-8, 8, (64, 1)),
        [[0.0, -0.0, 1e-45, -3e38, 3.4028235e38, 1.1754944e-38, 1e-30, 0.1, 1 / 3, 123456789.0] + [1.0] * 86],
    ]).astype(np.float32)
    text = json.dumps(_json_floats(rows).tolist())
    np.testing.assert_array_equal(np.array(json.loads(text), dtype=np.float32), rows)  # bit for bit
    text = json.dumps(_json_floats(rows[:64]).tolist())  # magnitudes 1e-9..1e8 (past 1e±22 they print in full)
    digits = [len(n.lstrip("-").split("e")[0].replace(".", "").strip("0")) for n in re.findall(r"[-0-9.e+]+", text)]
    assert max(digits) <= 9  # not the 17 digits of a float32 widened to float64


@pytest.mark.parametrize("with_orjson", [True, False])
def test_vectors_json_reads_back_as_the_same_float32_with_or_without_orjson(with_orjson, monkeypatch):
    from bertforge.serve import vectors_json

    if with_orjson:
        pytest.importorskip("orjson")
    else:
        monkeypatch.setitem(sys.modules, "orjson", None)  # `import orjson` fails: the json fallback
    rng = np.random.default_rng(1)
    rows = np.concatenate([rng.standard_normal((8, 16)) * 10.0 ** rng.integers(-8, 8, (8, 1)),
                           [[0.0, -0.0, 1e-45, -3e38, 3.4028235e38, 1e-30, 0.1, 1 / 3] + [1.0] * 8]]).astype(np.float32)
    body = vectors_json(rows)
    assert isinstance(body, bytes)
    np.testing.assert_array_equal(np.array(json.loads(body), dtype=np.float32), rows)  # bit for bit
    with pytest.raises(ValueError, match="non-finite"):
        vectors_json(np.array([[1.0, np.nan]], dtype=np.float32))


def test_openai_embeddings_are_the_same_floats_with_or_without_orjson(embed_server, monkeypatch):
    request = {"input": SENTENCES[:3], "model": "embed"}
    fast = embed_server.client.post("/v1/embeddings", json=request)
    monkeypatch.setitem(sys.modules, "orjson", None)  # `import orjson` fails: the json fallback
    slow = embed_server.client.post("/v1/embeddings", json=request)
    assert fast.status_code == slow.status_code == 200
    assert fast.content != slow.content  # two writers (orjson's shortest decimals, json's 9 digits)...
    a, b = fast.json(), slow.json()
    rows = [np.array([d["embedding"] for d in body["data"]], dtype=np.float32) for body in (a, b)]
    np.testing.assert_array_equal(rows[0], rows[1])  # ...the same float32 values, bit for bit
    assert {k: v for k, v in a.items() if k != "data"} == {k: v for k, v in b.items() if k != "data"}


def test_json_bytes_falls_back_to_json_for_what_orjson_refuses():
    from bertforge.serve import json_bytes

    data = {"model": "name-\udcff", "embedding": np.array([0.1, -2.5e-7], dtype=np.float32), "index": 0}
    body = json.loads(json_bytes(data))  # orjson refuses the lone surrogate; json escapes it
    assert body["model"] == "name-\udcff" and body["index"] == 0
    np.testing.assert_array_equal(np.array(body["embedding"], dtype=np.float32), data["embedding"])


# ------------------------------------------------------------------------------------------------- bad input
BAD = [
    ("/embed", b"not json", 400, "not valid JSON"),
    ("/embed", b'{"inputs": ["a"', 400, "not valid JSON"),
    ("/embed", b"\xff\xfe\x00garbage", 400, "not valid JSON"),
    ("/embed", b"[1, 2]", 422, "JSON object"),
    ("/embed", b"{}", 422, 'missing "inputs"'),
    ("/embed", b'{"inputs": 3}', 422, "a string or an array"),
    ("/embed", b'{"inputs": []}', 422, "empty array"),
    ("/embed", b'{"inputs": ["a", null]}', 422, '"inputs"[1] must be a string'),
    ("/embed", b'{"inputs": "a", "normalize": "yes"}', 422, '"normalize" must be true or false'),
    ("/embed", b'{"inputs": ["a", "b", "c", "d", "e", "f", "g", "h", "i"]}', 413, "more than this server takes"),
    ("/embed", b'{"inputs": "' + b"a " * 3000 + b'"}', 413, "larger than 4096 bytes"),
    ("/embed", b"[" * 2000 + b"]" * 2000, 400, "not valid JSON"),  # too deep for the parser: still a 4xx
    ("/v1/embeddings", b'{"input": [[1, 2, 3]]}', 422, "token ids"),
    ("/v1/embeddings", b'{"input": "a", "encoding_format": "int8"}', 422, "encoding_format"),
    ("/v1/embeddings", b'{"input": "a", "dimensions": 33}', 422, "dimensions"),
    ("/v1/embeddings", b'{"input": "a", "model": 7}', 422, '"model" must be a string'),
    ("/predict", b'{"inputs": "a"}', 400, "sequence-classification model"),
    ("/nowhere", b"{}", 404, "Not Found"),
]


@pytest.mark.parametrize("path,body,status,message", BAD, ids=[f"{p} {s} {m}" for p, _, s, m in BAD])
def test_bad_requests_get_4xx_json(embed_server, path, body, status, message):
    r = embed_server.client.post(path, content=body)
    assert r.status_code == status
    error = r.json()["error"]
    error = error["message"] if path.startswith("/v1/") else error  # OpenAI's error shape there
    assert message in error


def test_bad_requests_do_not_hurt_the_server(embed_server):
    for path, body, _, _ in BAD:
        embed_server.client.post(path, content=body)
    assert embed_server.client.get("/embed").status_code == 405
    assert embed_server.client.post("/embed", json={"inputs": "still here"}).status_code == 200
    assert embed_server.client.get("/health").json()["status"] == "ok"


def test_predict_bad_inputs(classify_server):
    for body, message in [({"inputs": [["a", "b", "c"]]}, "[text, text_pair]"), ({"inputs": [["a", 1]]}, "[text, text_pair]"),
                          ({"query": 1, "texts": ["a"]}, '"query" must be a string'),
                          ({"query": "q", "texts": []}, "empty array")]:
        path = "/rerank" if "query" in body else "/predict"
        r = classify_server.client.post(path, json=body)
        assert r.status_code == 422 and message in r.json()["error"], r.text


# ------------------------------------------------------------------------------------------------- batching, overload
def test_overload_is_refused_at_once_and_waiting_requests_are_batched(models):
    config = ServeConfig(model=str(models["embed"]), max_queue=2)
    with ThreadServer(config) as server, ThreadPoolExecutor(4) as pool:
        entered, release = block_worker(server.engine)
        first = pool.submit(server.client.post, "/embed", json={"inputs": SENTENCES[0]})
        assert entered.wait(TIMEOUT)  # the worker holds request 1; the queue is empty
        waiting = [pool.submit(server.client.post, "/embed", json={"inputs": text}) for text in SENTENCES[1:3]]
        deadline = time.monotonic() + TIMEOUT
        while server.engine.batcher.depth() < 2:
            assert time.monotonic() < deadline, "the requests never queued"
            time.sleep(0.01)
        start = time.monotonic()
        r = server.client.post("/embed", json={"inputs": "one too many"})
        assert r.status_code == 503 and "queue is full" in r.json()["error"] and r.headers["retry-after"] == "1"
        assert time.monotonic() - start < 2.0  # refused at once, not queued
        page = server.client.get("/metrics").text
        assert metric(page, "bertforge_queue_depth") == 2
        release.set()
        results = [f.result(TIMEOUT) for f in [first, *waiting]]
        assert [r.status_code for r in results] == [200, 200, 200]
        pipe = bertforge.pipeline("embed", model=models["embed"], normalize=True)
        np.testing.assert_allclose(np.array([r.json()[0] for r in results], dtype=np.float32), pipe(SENTENCES[:3]),
                                   rtol=0, atol=1e-5)
        page = server.client.get("/metrics").text
        # the two that waited together went through the model together: one batch of 2 requests
        assert metric(page, "bertforge_batch_requests_bucket", le="1") == 1
        assert metric(page, "bertforge_batch_requests_count") == 2
        assert metric(page, "bertforge_requests_total", route="/embed", status="503") == 1
        assert metric(page, "bertforge_queue_depth") == 0


def test_a_failing_model_call_is_a_500_and_spares_the_rest_of_its_batch(models):
    with ThreadServer(ServeConfig(model=str(models["embed"]))) as server, ThreadPoolExecutor(4) as pool:
        entered, release = block_worker(server.engine)
        blocker = pool.submit(server.client.post, "/embed", json={"inputs": "first"})
        assert entered.wait(TIMEOUT)
        real = server.engine.batcher.runners["embed"]

        def fragile(items, features):
            if "boom" in items:
                raise RuntimeError("the model fell over")
            return real(items, features)

        server.engine.batcher.runners["embed"] = fragile
        bad = pool.submit(server.client.post, "/embed", json={"inputs": ["fine", "boom"]})
        good = pool.submit(server.client.post, "/embed", json={"inputs": "good"})
        deadline = time.monotonic() + TIMEOUT
        while server.engine.batcher.depth() < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        release.set()
        assert blocker.result(TIMEOUT).status_code == 200
        r = bad.result(TIMEOUT)
        assert r.status_code == 500 and "the model fell over" in r.json()["error"]
        assert good.result(TIMEOUT).status_code == 200  # it shared a batch with the bad one, and was retried alone
        assert server.client.post("/embed", json={"inputs": "after"}).status_code == 200
        page = server.client.get("/metrics").text
        assert metric(page, "bertforge_batch_failures_total") >= 1
        assert metric(page, "bertforge_requests_total", route="/embed", status="500") == 1


def test_health_info_and_metrics(embed_server):
    client = embed_server.client
    assert client.get("/health").json() == {"status": "ok", "model": "embed", "task": "embed", "queue_depth": 0}
    info = client.get("/info").json()
    assert info["max_input_length"] == 64 and info["hidden_size"] == 32 and info["max_client_batch_size"] == 8
    before = client.get("/metrics").text
    n = metric(before, "bertforge_requests_total", route="/embed", status="200") if 'route="/embed",status="200"' in before else 0
    for _ in range(3):
        assert client.post("/embed", json={"inputs": "count me"}).status_code == 200
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    page = r.text
    assert metric(page, "bertforge_requests_total", route="/embed", status="200") == n + 3
    count = metric(page, "bertforge_request_duration_seconds_count", route="/embed")
    assert metric(page, "bertforge_request_duration_seconds_bucket", route="/embed", le="+Inf") == count
    assert "# TYPE bertforge_request_duration_seconds histogram" in page
    assert metric(page, "bertforge_batch_size_count") >= 3 and metric(page, "bertforge_queue_limit") == 512
    for line in page.splitlines():  # every line a comment or `name{labels} value`
        assert line.startswith("# ") or re.fullmatch(r'[a-z_]+(\{[^}]*\})? -?[0-9.e+-]+|[a-z_]+\{[^}]*\} \d+', line), line


# ------------------------------------------------------------------------------------------------- the serving process
def test_a_serving_process_hands_over_the_gil_sooner_and_keeps_freed_memory(monkeypatch, models):
    import bertforge.serve as serve
    import bertforge.system

    calls = []
    monkeypatch.setattr(bertforge.system, "reuse_freed_memory", lambda choice=None: calls.append(choice) or True)
    monkeypatch.setenv(serve.ENV_CONFIG, ServeConfig(model=str(models["embed"])).to_json())
    monkeypatch.setattr(serve, "create_app", lambda config: config)
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # Python's default (a server run earlier in this process may have changed it)
    try:
        assert serve.app_from_environment().model == str(models["embed"])
        assert sys.getswitchinterval() == serve.SWITCH_INTERVAL < 0.005
    finally:
        sys.setswitchinterval(before)
    assert calls == [None]


def test_all_of_the_models_torch_work_runs_in_the_batchers_thread(models, monkeypatch):
    """Loading (int8 calibration with it), the warm-up and every batch run in one thread: a second thread with
    parallel torch ops would give OpenMP a second team of threads, and its idle workers would then sleep between
    the ops of every small batch (see `Engine`)."""
    from bertforge.pipelines.base import Pipeline

    threads = set()
    init, run = Pipeline.__init__, Pipeline.run_features

    def spy_init(self, *args, **kwargs):
        threads.add(threading.current_thread().name)
        init(self, *args, **kwargs)

    def spy_run(self, inputs, features):
        threads.add(threading.current_thread().name)
        return run(self, inputs, features)

    monkeypatch.setattr(Pipeline, "__init__", spy_init)
    monkeypatch.setattr(Pipeline, "run_features", spy_run)
    with ThreadServer(ServeConfig(model=str(models["classify"]))) as s:
        assert s.client.post("/predict", json={"inputs": "good"}).status_code == 200
        assert s.client.post("/rerank", json={"query": "q", "texts": ["a", "b"]}).status_code == 200
    assert threads == {"bertforge-serve-batcher"}


def test_a_model_that_fails_to_load_raises_from_engine_and_leaves_no_thread(models):
    def batchers() -> int:
        return sum(t.name == "bertforge-serve-batcher" for t in threading.enumerate())

    before = batchers()
    with pytest.raises(bertforge.BertforgeError, match="--pooling is for embedding models"):
        Engine(ServeConfig(model=str(models["classify"]), pooling="mean"))
    assert batchers() == before
