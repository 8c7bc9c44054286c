"""`bertforge.pretrain.data`: a pretraining batch as the model's inputs, where static shards go, the document split
of --eval-fraction, and the corpus checks made before anything is written."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bertforge.core.errors import BertforgeError
from bertforge.pretrain.data import check_corpus, check_run_corpora, document_split, model_inputs, static_shard_dir
from tests.helpers import make_corpus


def test_model_inputs_take_the_sentence_label_only_where_the_objective_has_one():
    batch = {k: torch.zeros(2, 4, dtype=torch.long) for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}
    batch["special_tokens_mask"] = torch.zeros(2, 4)  # anything else a batch carries is not the model's
    assert set(model_inputs(batch)) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    batch["next_sentence_label"] = torch.zeros(2, dtype=torch.long)
    inputs = model_inputs(batch)
    assert inputs["next_sentence_label"] is batch["next_sentence_label"] and "special_tokens_mask" not in inputs


def test_static_shard_directories_and_the_document_split(tmp_path):
    assert static_shard_dir(tmp_path, 1, 4) == tmp_path / "static_shards" / "rank-00001-of-00004"
    assert document_split(SimpleNamespace(eval_fraction=None)) is None
    held_out = document_split(SimpleNamespace(eval_fraction=0.1), held_out=True)
    trained_on = document_split(SimpleNamespace(eval_fraction=0.1))
    assert (held_out.fraction, held_out.held_out, trained_on.held_out) == (0.1, True, False)
    assert all(held_out.keeps(i) != trained_on.keeps(i) for i in range(100))  # each document on one side


def test_a_corpus_the_run_cannot_train_on_is_refused(tmp_path):
    corpus = str(make_corpus(tmp_path / "corpus.txt", docs=3))
    check_corpus([corpus], "text", nsp=True)  # three documents: enough for next-sentence prediction
    one = tmp_path / "one.txt"
    one.write_text("river stone light .\ngarden window morning .\n")  # one document
    check_corpus([str(one)], "text", nsp=False)
    with pytest.raises(BertforgeError, match="has only 1 document; next-sentence prediction needs at least 2"):
        check_corpus([str(one)], "text", nsp=True)
    run = SimpleNamespace(text_column="text", nsp=True, allow_binary=False, eval_fraction=None, eval_corpus=[str(one)])
    with pytest.raises(BertforgeError, match="^--eval-corpus: corpus .* has only 1 document"):
        check_run_corpora(run, [corpus])  # the evaluation text is checked too, and named
