"""`bertforge.model.pooling`: mean and [CLS] pooling of packed rows (normalised or not), and the sentence-transformers
files that describe them, written and read back."""

from __future__ import annotations

import json

import pytest
import torch

from bertforge.model.pooling import mean_pool, pool, sentence_transformers_settings, write_sentence_transformers_files


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
    with pytest.raises(ValueError, match="unknown pooling 'max'"):
        pool(hidden, lengths, starts, "max")
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
    assert sentence_transformers_settings(tmp_path) == {"normalize": True, "pooling": "cls", "max_length": 128}
    plain = tmp_path / "plain"
    plain.mkdir()
    write_sentence_transformers_files(plain, 32, "mean", False, 64)
    assert sentence_transformers_settings(plain) == {"normalize": False, "pooling": "mean", "max_length": 64}
    assert not (plain / "2_Normalize").exists()
    assert sentence_transformers_settings(tmp_path / "nothing") == {} and sentence_transformers_settings(None) == {}
    with pytest.raises(ValueError, match="unknown pooling"):
        write_sentence_transformers_files(plain, 32, "max", False, 64)
