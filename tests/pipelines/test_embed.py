"""Tests of `bertforge.pipelines.embed`: sentence embeddings against sentence-transformers and transformers."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertforgeError
from bertforge.model import attention
from bertforge.pipelines import base as pipeline_base
from tests.pipelines.pipelines_helpers import LONG, SENTENCES

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[test]'")


def test_embed_equals_sentence_transformers(embed, minilm_dir, caplog, monkeypatch):
    st = pytest.importorskip("sentence_transformers")
    texts = SENTENCES + [LONG]
    ref = st.SentenceTransformer(str(minilm_dir), device="cpu").encode(texts, batch_size=4)
    assert embed.attention_padding == 0.5
    try:
        for padding, sdpa_only in ((0.0, False), (0.5, False), (100.0, True)):  # one call per run, or padded, masked
            embed.attention_padding = padding  # ones (every length merges when SDPA computes every call)
            if sdpa_only:
                monkeypatch.setattr(attention, "MATMUL_ATTENTION_MAX_LENGTH", {"one thread": 0, "threads": 0})
            with caplog.at_level(logging.WARNING, logger="bertforge"):
                ours = embed(texts)
            assert "1 input longer than max_length=256 tokens was truncated" in caplog.text
            assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
            assert embed.pooling == "mean" and embed.normalize and embed.max_length == 256  # read from the ST files
            cosine = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
            assert cosine.min() >= 0.99999
            assert np.abs(ours - ref).max() < 1e-5
    finally:
        del embed.attention_padding  # the class's default again


def test_embed_cls_unnormalized_equals_transformers(minilm_dir):
    pipe = bertforge.pipeline("embed", model=minilm_dir, pooling="cls", normalize=False)
    tok = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    ref = transformers.BertModel.from_pretrained(minilm_dir).eval()
    with torch.no_grad():
        expected = ref(**tok(SENTENCES, padding=True, return_tensors="pt")).last_hidden_state[:, 0].numpy()
    assert np.abs(pipe(SENTENCES) - expected).max() < 1e-5


def test_embed_order_single_stream_and_empty(embed, monkeypatch):
    together = embed(SENTENCES)
    assert np.abs(embed(SENTENCES[3]) - together[3]).max() < 1e-6  # one text → [hidden]
    monkeypatch.setattr(pipeline_base, "CHUNK_SIZE", 3)  # several chunks, tokenized in the background
    streamed = np.stack(list(embed.stream(t for t in SENTENCES)))
    assert np.abs(streamed - together).max() < 1e-6
    assert embed([]).shape == (0, 384)


def test_embed_bad_options_and_inputs(minilm_dir, embed):
    with pytest.raises(BertforgeError, match="pooling must be one of"):
        bertforge.pipeline("embed", model=minilm_dir, pooling="median")
    with pytest.raises(BertforgeError, match="max_length must be"):
        bertforge.pipeline("embed", model=minilm_dir, max_length=100000)
    with pytest.raises(BertforgeError, match="input 1 is a int"):
        embed(["fine", 3])
    with pytest.raises(BertforgeError, match="no such model directory"):
        bertforge.pipeline("embed", model=minilm_dir / "nope")
    with pytest.raises(BertforgeError, match="unknown task"):
        bertforge.pipeline("summarize", model=minilm_dir)


def test_feature_extraction_returns_token_vectors_as_transformers_does(minilm_dir):
    """`feature-extraction` means what it means in transformers: every token's last hidden state, special tokens
    included, nested [1, tokens, hidden] per text; not pooled sentence vectors (#33)."""
    transformers = pytest.importorskip("transformers")
    texts = ["a dog", "the cat sat on the mat by the door"]
    reference = transformers.pipeline("feature-extraction", model=str(minilm_dir), device="cpu")
    ours = bertforge.pipeline("feature-extraction", model=minilm_dir)
    for text, expected in zip(texts, reference(texts)):
        got = ours(text)
        assert np.asarray(got).shape == np.asarray(expected).shape == (1, len(reference.tokenizer(text)["input_ids"]), 384)
        assert np.abs(np.asarray(got) - np.asarray(expected)).max() <= 1e-5
    assert [np.asarray(x).shape for x in ours(texts)] == [np.asarray(x).shape for x in reference(texts)]
    with pytest.raises(bertforge.BertforgeError, match="use pipeline\\(\"embed\"\\)"):
        bertforge.pipeline("feature-extraction", model=minilm_dir, pooling="mean")


def test_prompts_by_name_and_by_default_equal_sentence_transformers(minilm_dir, tmp_path):
    """A directory's prompts (nomic-embed's "search_query: " / "search_document: ") put before every text as
    `SentenceTransformer.encode(prompt_name=...)` does, its default prompt when none is named; "" puts none."""
    import json
    import shutil

    st = pytest.importorskip("sentence_transformers")
    directory = tmp_path / "prompted"
    shutil.copytree(minilm_dir, directory)
    prompts = {"search_query": "search_query: ", "search_document": "search_document: "}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": prompts, "default_prompt_name": "search_document", "similarity_fn_name": "cosine"}))
    reference = st.SentenceTransformer(str(directory), device="cpu")
    texts = SENTENCES[:6]
    for name in ("search_query", None):
        ours = bertforge.pipeline("embed", model=directory, prompt_name=name)(texts)
        theirs = reference.encode(texts, prompt_name=name, convert_to_numpy=True)
        assert np.abs(ours - theirs).max() < 1e-5, name
    plain = bertforge.pipeline("embed", model=directory, prompt="")(texts)
    assert np.abs(plain - reference.encode(texts, prompt="", convert_to_numpy=True)).max() < 1e-5
    assert np.abs(plain - bertforge.pipeline("embed", model=directory, prompt_name="search_query")(texts)).max() > 1e-3
    with pytest.raises(BertforgeError, match="unknown prompt_name 'query'; this model's prompts: 'search_query', "):
        bertforge.pipeline("embed", model=directory, prompt_name="query")
    with pytest.raises(BertforgeError, match="prompt_name or prompt, not both"):
        bertforge.pipeline("embed", model=directory, prompt_name="search_query", prompt="x")


def test_call_time_options(minilm_dir, embed):
    """normalize, batch_size and max_length at call time: that call only, as the pipeline built with them."""
    texts = SENTENCES[:5]
    assert embed.normalize  # all-MiniLM-L6-v2 declares its Normalize module
    np.testing.assert_array_equal(embed(texts, normalize=False),
                                  bertforge.pipeline("embed", model=minilm_dir, normalize=False)(texts))
    np.testing.assert_array_equal(embed(texts, max_length=8),
                                  bertforge.pipeline("embed", model=minilm_dir, max_length=8)(texts))
    np.testing.assert_allclose(embed(texts, batch_size=1, max_batch_tokens=16), embed(texts), rtol=0, atol=1e-5)
    assert embed.normalize and embed.max_length == 256 and embed.batch_size == 256
    with pytest.raises(BertforgeError, match=r"embed: `normalize_embeddings` is not supported; it is called normalize"):
        embed(texts, normalize_embeddings=False)
    with pytest.raises(BertforgeError, match=r"embed: `num_workers` is not supported; .*num_threads=N"):
        embed(texts, num_workers=2)
    features = bertforge.pipeline("feature-extraction", model=minilm_dir)
    assert features(texts[0], truncation=True) == features(texts[0])
    with pytest.raises(BertforgeError, match=r"feature-extraction: `return_tensors` is not supported; .*nested lists"):
        features(texts[0], return_tensors=True)
    with pytest.raises(BertforgeError, match=r"feature-extraction: unknown option `normalize`"):
        features(texts[0], normalize=True)


def test_dense_modules_between_pooling_and_normalize_equal_sentence_transformers(minilm_dir, tmp_path):
    """A sentence-transformers model of Transformer → Pooling → Dense → Dense → Normalize (LaBSE's projection,
    EmbeddingGemma's pair), saved by sentence-transformers itself: bertforge applies the Dense modules in order
    before normalising, and its vectors are sentence-transformers' (and `embed --out DIR`'s width the last one's)."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers import models

    torch.manual_seed(0)
    modules = [models.Transformer(str(minilm_dir)), models.Pooling(384, "mean"),
               models.Dense(384, 96),  # tanh(W x + b): sentence-transformers' default
               models.Dense(96, 48, bias=False, activation_function=torch.nn.Identity()), models.Normalize()]
    directory = tmp_path / "two-dense"
    st.SentenceTransformer(modules=modules, device="cpu").save(str(directory))
    reference = st.SentenceTransformer(str(directory), device="cpu").encode(SENTENCES, batch_size=4)
    embed = bertforge.pipeline("embed", model=directory)
    vectors = embed(SENTENCES)
    assert vectors.shape == (len(SENTENCES), 48) and embed.vector_size() == 48
    np.testing.assert_allclose(vectors, reference, rtol=0, atol=1e-5)
    raw = bertforge.pipeline("embed", model=directory, normalize=False)(SENTENCES)
    assert abs(np.linalg.norm(raw, axis=1) - 1).max() > 0.01  # the Normalize is the last module, not the Dense's
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), vectors, rtol=0, atol=1e-6)
    (directory / "3_Dense" / "model.safetensors").unlink()
    with pytest.raises(BertforgeError, match="Dense module '3_Dense'.*has no model.safetensors"):
        bertforge.pipeline("embed", model=directory)
