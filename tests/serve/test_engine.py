"""Tests of `bertforge.serve.engine`: a request is tokenized once; all of the model's torch work runs in the
batcher's thread; a model that fails to load leaves no thread behind; which checkpoints have an MLM head."""

from __future__ import annotations

import threading

import pytest

import bertforge
from bertforge.serve import Engine, ServeConfig
from tests.serve.serve_helpers import SENTENCES, ThreadServer

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")


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


@pytest.mark.parametrize("model_type, architecture, mlm", [
    ("bert", "BertForMaskedLM", True), ("albert", "AlbertForPreTraining", True), (None, "BertForPreTraining", True),
    ("electra", "ElectraForMaskedLM", True), ("electra", "ElectraForPreTraining", False),  # ELECTRA's discriminator
    ("bert", "BertModel", False), ("gpt2", "GPT2LMHeadModel", False)])
def test_an_mlm_head_is_told_by_the_familys_class_names(tmp_path, model_type, architecture, mlm):
    """What /embed_sparse needs: ELECTRA's ElectraForPreTraining is the discriminator, with no MLM head."""
    import json

    from bertforge.serve.engine import has_mlm_head

    config = {"architectures": [architecture], **({"model_type": model_type} if model_type else {})}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert has_mlm_head(tmp_path) is mlm
