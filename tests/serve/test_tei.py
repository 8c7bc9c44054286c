"""Tests of `bertforge.serve.tei`: text-embeddings-inference's /embed_all, /embed_sparse, /similarity, /tokenize
and /decode over HTTP, each against its reference: `transformers`' models and pipeline, the `tokenizers`
tokenizer, and the server's own /embed."""

from __future__ import annotations

import numpy as np
import pytest

import bertforge
from bertforge.serve import ServeConfig
from tests.serve.serve_helpers import LONG, SENTENCES, ThreadServer

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")
transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[test]'")
tokenizers = pytest.importorskip("tokenizers")
torch = pytest.importorskip("torch")


def _hidden_states(model_dir, texts, **tokenizer_options) -> list[np.ndarray]:
    """transformers' BertModel's last hidden states, one [tokens, H] array per text (each alone: no padding)."""
    tok = transformers.BertTokenizerFast.from_pretrained(str(model_dir), **tokenizer_options)
    model = transformers.BertModel.from_pretrained(str(model_dir)).eval()
    out = []
    with torch.no_grad():
        for text in texts:
            enc = tok(text, truncation=True, max_length=64, return_tensors="pt")
            out.append(model(**enc).last_hidden_state[0].numpy())
    return out


def test_embed_all_is_every_tokens_vector(embed_server, models):
    r = embed_server.client.post("/embed_all", json={"inputs": SENTENCES})
    assert r.status_code == 200
    got = r.json()
    pipe = bertforge.pipeline("feature-extraction", model=models["embed"])
    assert len(got) == len(SENTENCES)
    for rows, ours, theirs in zip(got, pipe(SENTENCES), _hidden_states(models["embed"], SENTENCES), strict=True):
        assert np.array(rows).shape == np.array(ours[0]).shape == theirs.shape  # [CLS] ... [SEP], each [tokens, H]
        np.testing.assert_allclose(np.array(rows, dtype=np.float32), ours[0], rtol=0, atol=1e-5)
        np.testing.assert_allclose(np.array(rows, dtype=np.float32), theirs, rtol=0, atol=1e-4)
    one = embed_server.client.post("/embed_all", json={"inputs": SENTENCES[0]}).json()
    assert len(one) == 1 and np.allclose(one[0], got[0], atol=1e-6)  # a string: still a list, one per input


def test_embed_all_truncates_either_end(embed_server, models):
    text = LONG + "it was bad"
    r = embed_server.client.post("/embed_all", json={"inputs": text, "truncate": False})
    assert r.status_code == 422 and r.json()["error_type"] == "Validation" and "truncate" in r.json()["error"]
    ends = []
    for direction, side in (("Right", "right"), ("Left", "left")):
        r = embed_server.client.post("/embed_all", json={"inputs": [text], "truncate": True,
                                                         "truncation_direction": direction})
        assert r.status_code == 200, r.text
        want = _hidden_states(models["embed"], [text], truncation_side=side)[0]
        got = np.array(r.json()[0], dtype=np.float32)
        assert got.shape == want.shape == (64, 32)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
        ends.append(got)
    assert np.abs(ends[0] - ends[1]).max() > 0.1  # the two ends of the text really differ
    r = embed_server.client.post("/embed_all", json={"inputs": [text] * 8, "truncate": True})
    assert r.status_code == 200 and len(r.json()) == 8  # 8 x 64 = 512 tokens
    with ThreadServer(ServeConfig(model=str(models["embed"]), max_batch_tokens=500)) as small:
        r = small.client.post("/embed_all", json={"inputs": [text] * 8, "truncate": True})
        assert r.status_code == 422 and "512 tokens" in r.json()["error"]  # its answer is every token's vector
        assert "--max-batch-tokens" in r.json()["error"]
        assert small.client.post("/embed", json={"inputs": [text] * 8, "truncate": True}).status_code == 200
    r = embed_server.client.post("/embed_all", json={"inputs": "x", "truncation_direction": "Up"})
    assert r.status_code == 422 and "truncation_direction" in r.json()["error"]


def test_similarity_is_the_cosine_of_the_embeddings(embed_server):
    source, sentences = SENTENCES[0], SENTENCES[1:]
    r = embed_server.client.post("/similarity", json={"inputs": {"source_sentence": source, "sentences": sentences}})
    assert r.status_code == 200
    vectors = np.array(embed_server.client.post("/embed", json={"inputs": [source, *sentences]}).json())
    want = vectors[1:] @ vectors[0]  # /embed's vectors are unit length
    np.testing.assert_allclose(r.json(), want, rtol=0, atol=1e-5)
    assert len(set(np.round(want, 3))) > 1  # different sentences, different scores
    body = {"inputs": {"source_sentence": LONG, "sentences": ["good"]}}
    assert embed_server.client.post("/similarity", json={**body, "parameters": {"truncate": False}}).status_code == 422
    assert embed_server.client.post("/similarity", json=body).status_code == 200  # --auto-truncate: on
    r = embed_server.client.post("/similarity", json={"inputs": {"source_sentence": "a", "sentences": ["b"] * 8}})
    assert r.status_code == 422 and r.json()["error"] == "batch size 9 > maximum allowed batch size 8"  # TEI's words
    r = embed_server.client.post("/similarity", json={"inputs": {"source_sentence": "a", "sentences": []}})
    assert r.status_code == 400 and r.json()["error_type"] == "Empty"
    r = embed_server.client.post("/similarity", json={"inputs": ["a", "b"]})
    assert r.status_code == 422 and "source_sentence" in r.json()["error"]


def test_embed_sparse_is_splade_from_the_mlm_logits(mlm_server, models):
    texts = SENTENCES[:3]
    assert mlm_server.client.get("/info").json()["sparse"] is True
    r = mlm_server.client.post("/embed_sparse", json={"inputs": texts})
    assert r.status_code == 200
    tok = transformers.BertTokenizerFast.from_pretrained(str(models["mlm"]))
    model = transformers.BertForMaskedLM.from_pretrained(str(models["mlm"])).eval()
    for entries, text in zip(r.json(), texts, strict=True):
        with torch.no_grad():
            logits = model(**tok(text, return_tensors="pt")).logits[0]  # [tokens, V]
        want = torch.log1p(torch.relu(logits)).amax(dim=0).numpy()  # max over the tokens of log(1 + relu)
        indices = [e["index"] for e in entries]
        assert indices == sorted(indices) and all(e["value"] != 0 for e in entries)
        assert indices == np.flatnonzero(want).tolist()
        np.testing.assert_allclose([e["value"] for e in entries], want[indices], rtol=0, atol=1e-4)
        assert 0 < len(entries) < model.config.vocab_size  # really sparse: relu zeroes the negative logits


def test_an_mlm_model_is_loaded_once_for_all_its_routes(models, tmp_path):
    """/embed, /embed_all and /embed_sparse of a masked-LM checkpoint share one model (its encoder embeds), and the
    directory's sentence-transformers settings (here [CLS] pooling, max_seq_length 8) still apply to /embed."""
    import shutil

    from bertforge.model.pooling import write_sentence_transformers_files

    directory = tmp_path / "splade"
    shutil.copytree(models["mlm"], directory)
    write_sentence_transformers_files(directory, hidden_size=32, pooling="cls", normalize=False, max_length=8)
    with ThreadServer(ServeConfig(model=str(directory), pooling="splade")) as server:
        pipes = server.engine.pipelines
        assert pipes["embed"].model is pipes["embed_sparse"].model is pipes["embed_all"].model
        assert pipes["embed"].pooling == "cls" and pipes["embed"].max_length == pipes["embed_sparse"].max_length == 8
        r = server.client.post("/embed", json={"inputs": [LONG, "good"], "truncate": True, "normalize": False})
        want = bertforge.pipeline("embed", model=directory)([LONG, "good"])  # a BertModel of its own, from the files
        np.testing.assert_allclose(np.array(r.json(), dtype=np.float32), want, rtol=0, atol=1e-5)
        sparse = bertforge.pipeline("sparse-embed", model=directory, max_length=8)([LONG])[0]
        r = server.client.post("/embed_sparse", json={"inputs": LONG, "truncate": True})
        assert [e["index"] for e in r.json()[0]] == np.flatnonzero(sparse).tolist()


def test_embed_sparse_needs_a_sparse_model(embed_server, models):
    """Only a SPLADE model (or a masked-LM one with --pooling splade, TEI's rule) answers /embed_sparse: a plain
    masked-LM directory is an embedding model (the probe's 248 MB answers came from serving every MLM as sparse)."""
    assert embed_server.client.get("/info").json()["sparse"] is False
    r = embed_server.client.post("/embed_sparse", json={"inputs": "good"})
    assert r.status_code == 424  # TEI's status for a model that is not SPLADE
    assert r.json()["error_type"] == "Backend"
    assert "Model is not an embedding model with SPLADE pooling" in r.json()["error"]
    assert "\n" not in r.json()["error"]
    with ThreadServer(ServeConfig(model=str(models["mlm"]))) as plain:
        assert "embed_sparse" not in plain.engine.pipelines
        assert plain.client.post("/embed_sparse", json={"inputs": "good"}).status_code == 424
    from bertforge.core.errors import BertforgeError
    from bertforge.serve import Engine

    with pytest.raises(BertforgeError, match="--pooling splade needs a masked-LM checkpoint"):
        Engine(ServeConfig(model=str(models["embed"]), pooling="splade"))


def test_embed_sparse_answers_are_bounded(models):
    with ThreadServer(ServeConfig(model=str(models["mlm"]), pooling="splade", max_response_values=200)) as small:
        vocab = small.engine.tokenizer.vocab_size  # 84: two inputs may answer 168 values, three 252
        assert small.client.post("/embed_sparse", json={"inputs": ["good"] * 2}).status_code == 200
        r = small.client.post("/embed_sparse", json={"inputs": ["good"] * 3})
        assert r.status_code == 422 and "--max-response-values (200)" in r.json()["error"], (vocab, r.text)
        r = small.client.post("/vertex", json={"instances": [{"inputs": "good"}] * 3})  # the sum of the instances
        assert r.status_code == 422 and "--max-response-values (200)" in r.json()["error"], r.text
        assert small.client.post("/vertex", json={"instances": [{"inputs": "good"}] * 2}).status_code == 200


def test_tokenize_and_decode_round_trip_as_the_tokenizers_tokenizer(embed_server, models):
    reference = tokenizers.BertWordPieceTokenizer(str(models["embed"] / "vocab.txt"), lowercase=True)
    texts = ["The movie was GOOD!", "the café , très bad", ""]
    r = embed_server.client.post("/tokenize", json={"inputs": texts})
    assert r.status_code == 200
    for tokens, text in zip(r.json(), texts, strict=True):
        want = reference.encode(text)
        assert [t["id"] for t in tokens] == want.ids
        assert [t["special"] for t in tokens] == [bool(m) for m in want.special_tokens_mask]
        for token, (start, stop), special, piece in zip(tokens, want.offsets, want.special_tokens_mask, want.tokens):
            if special:
                assert (token["text"], token["start"], token["stop"]) == (piece, None, None)
            else:  # TEI's offsets count bytes of the UTF-8 input
                assert token["start"] == len(text[:start].encode()) and token["stop"] == len(text[:stop].encode())
                assert token["text"] == text[start:stop]
        r = embed_server.client.post("/decode", json={"ids": [t["id"] for t in tokens]})
        assert r.status_code == 200 and r.json() == [reference.decode(want.ids)]
    plain = embed_server.client.post("/tokenize", json={"inputs": texts[0], "add_special_tokens": False}).json()
    assert [t["id"] for t in plain[0]] == reference.encode(texts[0], add_special_tokens=False).ids
    batch = [reference.encode(t).ids for t in texts]
    r = embed_server.client.post("/decode", json={"ids": batch, "skip_special_tokens": False})
    assert r.json() == [reference.decode(ids, skip_special_tokens=False) for ids in batch]


def test_tokenize_and_decode_refuse_what_they_cannot_take(embed_server):
    client = embed_server.client
    r = client.post("/decode", json={"ids": [2, 10**6]})
    assert r.status_code == 422 and '"ids"[1]' in r.json()["error"]
    r = client.post("/decode", json={"ids": [[2]] * 9})
    assert r.status_code == 422 and r.json() == {"error": "batch size 9 > maximum allowed batch size 8",
                                                 "error_type": "Validation"}
    assert client.post("/decode", json={"ids": "2 3"}).status_code == 422
    assert client.post("/decode", json={"ids": []}).status_code == 400
    assert client.post("/tokenize", json={"inputs": []}).status_code == 400  # TEI's Empty
    r = client.post("/tokenize", json={"inputs": "x" * 1025})  # past max_input_chars: 16 x 64
    assert r.status_code == 422 and "characters" in r.json()["error"]
    r = client.post("/tokenize", json={"inputs": ["good " * 200] * 8})  # 8 x 202 tokens > --max-batch-tokens
    with ThreadServer(ServeConfig(model=str(embed_server.engine.config.model), max_batch_tokens=1000)) as small:
        r = small.client.post("/tokenize", json={"inputs": ["good " * 200] * 8})
        assert r.status_code == 422 and "--max-batch-tokens" in r.json()["error"]
    for route in ("/tokenize", "/embed", "/embed_all"):  # a prompt the model does not define: refused, not ignored
        r = client.post(route, json={"inputs": "x", "prompt_name": "query"})
        assert r.status_code == 422 and "prompt_name" in r.json()["error"], route


def test_the_huggingface_hub_inference_client_works_unchanged(embed_server, models):
    """TEI's own client calls, as TEI's quick tour writes them (`model="http://HOST:PORT/embed"`), against this
    server: huggingface_hub's InferenceClient, no network beyond localhost."""
    hub = pytest.importorskip("huggingface_hub")
    client = hub.InferenceClient(timeout=15)
    vectors = client.feature_extraction(SENTENCES[:2], model=embed_server.url + "/embed")
    pipe = bertforge.pipeline("embed", model=models["embed"], normalize=True)
    assert vectors.dtype == np.float32 and vectors.shape == (2, 32)
    np.testing.assert_allclose(vectors, pipe(SENTENCES[:2]), rtol=0, atol=1e-5)
    raw = client.feature_extraction(SENTENCES[0], model=embed_server.url + "/embed", normalize=False)
    np.testing.assert_allclose(raw[0], bertforge.pipeline("embed", model=models["embed"])(SENTENCES[0]), atol=1e-5)
    scores = client.sentence_similarity(SENTENCES[0], other_sentences=SENTENCES[1:4],
                                        model=embed_server.url + "/similarity")
    want = pipe(SENTENCES[1:4]) @ pipe(SENTENCES[0])
    np.testing.assert_allclose(scores, want, rtol=0, atol=1e-5)


def test_teis_routes_for_hosted_endpoints(embed_server, classify_server):
    """POST / and /invocations are the model's own route, GET / and /ping its health, /embeddings /v1/embeddings."""
    for client, route in ((embed_server.client, "/embed"), (classify_server.client, "/predict")):
        want = client.post(route, json={"inputs": ["good", "bad"]}).json()
        for path in ("/", "/invocations"):
            r = client.post(path, json={"inputs": ["good", "bad"]})
            assert r.status_code == 200 and r.json() == want, (route, path)
        for path in ("/", "/ping"):
            assert client.get(path).json() == client.get("/health").json()
    client = embed_server.client
    assert client.post("/embeddings", json={"input": "good"}).json() == client.post(
        "/v1/embeddings", json={"input": "good"}).json()
    r = client.post("/embeddings", json={"input": []})  # TEI's flat OpenAICompatErrorResponse
    assert r.status_code == 400 and r.json() == {"message": "`input` cannot be empty", "code": 400, "type": "Empty"}
