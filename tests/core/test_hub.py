"""Tests of `bertforge.core.hub`: a Hugging Face Hub id works wherever a model directory does, resolved from a cache
laid out here (no network: offline mode), with `@revision`; an id that cannot be resolved gets one line (#33)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import bertforge
from bertforge import BertforgeError
from bertforge.core.hub import looks_like_hub_id, model_path, model_reference

pytest.importorskip("huggingface_hub")
from huggingface_hub import constants as hub_constants  # noqa: E402
SHA, OLD_SHA = "a" * 40, "b" * 40


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A Hub cache holding `acme/tiny-bert` at two commits (main and the tag v1), in huggingface_hub's layout, with
    offline mode on, so nothing can come from the network."""
    from tests.finetune.conftest import save_tiny_model
    root = tmp_path / "hub"
    repo = root / "models--acme--tiny-bert"
    save_tiny_model(repo / "snapshots" / SHA)
    shutil.copytree(repo / "snapshots" / SHA, repo / "snapshots" / OLD_SHA)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    (repo / "refs" / "v1").write_text(OLD_SHA)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return repo


def test_a_hub_id_resolves_from_the_cache_everywhere_a_directory_does(cache, tmp_path, monkeypatch):
    assert model_path("acme/tiny-bert") == cache / "snapshots" / SHA
    assert model_path("acme/tiny-bert@v1") == cache / "snapshots" / OLD_SHA
    assert model_path("acme/tiny-bert", revision="v1") == cache / "snapshots" / OLD_SHA
    by_id = bertforge.BertModel.from_pretrained("acme/tiny-bert")
    by_dir = bertforge.BertModel.from_pretrained(cache / "snapshots" / SHA)
    assert all(np.array_equal(a.detach().numpy(), b.detach().numpy())
               for a, b in zip(by_id.parameters(), by_dir.parameters()))
    assert bertforge.AutoConfig.from_pretrained("acme/tiny-bert").hidden_size == by_dir.config.hidden_size
    embed = bertforge.pipeline("embed", model="acme/tiny-bert")
    assert embed(["paris is a city"]).shape == (1, by_dir.config.hidden_size)
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "acme" / "tiny-bert"  # a directory of that name here wins over the Hub id
    shutil.copytree(cache / "snapshots" / SHA, local)
    assert model_path("acme/tiny-bert") == local.relative_to(tmp_path)


def test_an_id_that_cannot_be_resolved_gets_one_line(cache):
    with pytest.raises(BertforgeError, match="acme/missing: not a directory here, and not a model in the Hugging Face "
                                             "cache"):
        bertforge.BertModel.from_pretrained("acme/missing")
    with pytest.raises(BertforgeError, match="revision nope"):
        model_path("acme/tiny-bert@nope")


def test_what_counts_as_an_id_and_what_a_run_records(tmp_path):
    assert looks_like_hub_id("bert-base-uncased") and looks_like_hub_id("google-bert/bert-base-uncased@main")
    assert not looks_like_hub_id("../model") and not looks_like_hub_id("/abs/path") and not looks_like_hub_id("a/b/c")
    assert not looks_like_hub_id("config.json")
    assert model_reference("acme/tiny-bert") == "acme/tiny-bert"
    assert model_reference(tmp_path) == str(tmp_path.resolve())
    assert model_path(tmp_path / "absent") == tmp_path / "absent"  # not an id: the caller says "no such directory"
