"""Tests of `bertforge.pipelines.sparse`: SPLADE vectors against a direct computation from `transformers`'
BertForMaskedLM logits on the same checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

import bertforge
from bertforge import BertforgeError
from bertforge.pipelines.sparse import nonzero

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[test]'")
torch = pytest.importorskip("torch")

TEXTS = ["The capital of France is Paris.", "a", "", "Lobsters live in the cold sea, said the man, twice."]


def reference(model_dir, texts) -> np.ndarray:
    """max over a text's tokens of log(1 + relu(logits)), from transformers' MLM logits of a padded batch."""
    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.BertForMaskedLM.from_pretrained(str(model_dir)).eval()
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits  # [B, S, V]
    values = torch.log1p(torch.relu(logits)) * enc["attention_mask"][..., None]  # padding: 0, never the max
    return values.amax(dim=1).numpy()


def test_sparse_embed_equals_the_mlm_logits(mlm_dir):
    pipe = bertforge.pipeline("sparse-embed", model=mlm_dir)
    got = pipe(TEXTS)
    want = reference(mlm_dir, TEXTS)
    assert got.shape == want.shape == (len(TEXTS), pipe.model.config.vocab_size)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)
    np.testing.assert_allclose(pipe(TEXTS[0]), got[0], rtol=0, atol=1e-5)  # alone as in a batch
    indices, values = nonzero(got[0])
    assert (values > 0).all() and len(indices) == np.count_nonzero(want[0] > 0) < got.shape[1]
    np.testing.assert_array_equal(got[0][indices], values)


def test_a_model_without_an_mlm_head_is_refused(minilm_dir):
    with pytest.raises(BertforgeError, match=r"has no MLM head"):
        bertforge.pipeline("sparse-embed", model=minilm_dir)


def test_call_time_options(mlm_dir):
    pipe = bertforge.pipeline("sparse-embed", model=mlm_dir)
    np.testing.assert_allclose(pipe(TEXTS, batch_size=1), pipe(TEXTS), rtol=0, atol=1e-5)
    np.testing.assert_array_equal(pipe(TEXTS, max_length=4), bertforge.pipeline("sparse-embed", model=mlm_dir,
                                                                                max_length=4)(TEXTS))
    assert pipe.batch_size == 256 and pipe.max_length == 512
    with pytest.raises(BertforgeError, match=r"sparse-embed: `tokenize_kwargs` is not supported"):
        pipe(TEXTS, tokenize_kwargs={})
