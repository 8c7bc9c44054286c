"""Tests of `bertforge.core.hub`: a Hugging Face Hub id works wherever a model directory does, resolved from a cache
laid out here (no network: offline mode), with `@revision`; an id that cannot be resolved gets one line (#33)."""

from __future__ import annotations

import hashlib
import json
import os
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
    assert model_reference(tmp_path) == str(tmp_path.resolve())
    assert model_path(tmp_path / "absent") == tmp_path / "absent"  # not an id: the caller says "no such directory"


def as_blobs(snapshot, names):
    """`names` of `snapshot` moved into the repository's blobs/ and linked back, as huggingface_hub lays them out."""
    blobs = snapshot.parent.parent / "blobs"
    blobs.mkdir(exist_ok=True)
    for name in names:
        data = (snapshot / name).read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).unlink()
        os.symlink(os.path.relpath(blob, snapshot), snapshot / name)
    return blobs


def test_a_snapshot_without_weights_is_incomplete_and_the_download_is_tried(cache, monkeypatch):
    """Issue 46: a snapshot holding config and tokenizer only (what a config-only download leaves) was used as it
    is. The config and the tokenizer still load from it; the weights try the download, and where that fails, one
    line says the cached copy is incomplete."""
    import huggingface_hub

    snapshot = cache / "snapshots" / SHA
    saved = (snapshot / "model.safetensors").read_bytes()
    (snapshot / "model.safetensors").unlink()
    assert bertforge.AutoConfig.from_pretrained("acme/tiny-bert").hidden_size > 0
    assert bertforge.Tokenizer.from_pretrained("acme/tiny-bert").vocab_size > 0
    with pytest.raises(BertforgeError, match=r"acme/tiny-bert: the copy in the Hugging Face cache .* is incomplete "
                                             r"\(config.json without weights.*downloading it failed") as err:
        bertforge.BertModel.from_pretrained("acme/tiny-bert")
    assert "\n" not in str(err.value)
    real, calls = huggingface_hub.snapshot_download, []

    def download(repo, revision=None, local_files_only=False, **kw):
        calls.append(local_files_only)
        if not local_files_only:  # the network: the missing file arrives
            (snapshot / "model.safetensors").write_bytes(saved)
        return real(repo, revision=revision, local_files_only=True)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    assert bertforge.BertModel.from_pretrained("acme/tiny-bert") is not None
    assert calls == [True, False]  # the cache first, as it was; then the download, once


def test_a_dangling_link_in_a_snapshot_is_named(cache):
    """An interrupted download (or a cleaned cache) leaves a snapshot's link to a blob that is not there."""
    snapshot = cache / "snapshots" / SHA
    blobs = as_blobs(snapshot, ["model.safetensors", "config.json"])
    assert bertforge.BertModel.from_pretrained("acme/tiny-bert") is not None  # the layout itself is fine
    (blobs / os.readlink(snapshot / "model.safetensors").rsplit("/", 1)[-1]).unlink()
    with pytest.raises(BertforgeError, match=r"is incomplete \(model.safetensors: a link to a missing file\)"):
        bertforge.BertModel.from_pretrained("acme/tiny-bert")


def test_shards_missing_from_an_index_make_a_snapshot_incomplete(cache):
    snapshot = cache / "snapshots" / SHA
    (snapshot / "model.safetensors").rename(snapshot / "model-00001-of-00002.safetensors")
    weight_map = {"embeddings.word_embeddings.weight": "model-00001-of-00002.safetensors",
                  "pooler.dense.weight": "model-00002-of-00002.safetensors"}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(BertforgeError, match=r"shards model-00002-of-00002.safetensors of "
                                             r"model.safetensors.index.json missing"):
        bertforge.BertModel.from_pretrained("acme/tiny-bert")


def test_a_run_records_the_commit_its_hub_id_resolved_to(cache, tmp_path):
    """A run given `org/name` records `org/name@<commit>`: `--resume` and `--run-config` load the weights it started
    from even after the branch moved, and a resume naming the moved id is refused as a changed setting."""
    from bertforge.finetune import finetune
    from tests.finetune.conftest import write_sentiment

    assert model_reference("acme/tiny-bert") == f"acme/tiny-bert@{SHA}"
    assert model_reference("acme/tiny-bert@v1") == f"acme/tiny-bert@{OLD_SHA}"
    train = write_sentiment(tmp_path / "train.tsv", 8)
    out = tmp_path / "run"
    run = dict(task="classification", train=str(train), dev=str(train), out=str(out), epochs=1, batch_size=4, progress=False,
               device="cpu")
    finetune(model="acme/tiny-bert", **run)
    recorded = json.loads((out / "finetune_config.json").read_text(encoding="utf-8"))["model"]
    assert recorded == f"acme/tiny-bert@{SHA}"
    (cache / "refs" / "main").write_text(OLD_SHA)  # the branch moves on
    assert model_path(recorded) == cache / "snapshots" / SHA  # what --resume / --run-config replay
    with pytest.raises(BertforgeError, match=f"--resume with settings that differ.*acme/tiny-bert@{OLD_SHA}"):
        finetune(model="acme/tiny-bert", resume=True, **run)


def test_an_adapter_trained_on_a_hub_id_records_its_commit_for_peft_and_for_bertforge(cache, tmp_path):
    """LoRA on `acme/tiny-bert`: adapter_config.json says the base as PEFT spells it, the id and the commit apart
    (`revision`), and loading the adapter later takes that commit even after the branch moved (#46)."""
    from bertforge.finetune import finetune
    from bertforge.model.lora import adapted_config
    from tests.finetune.conftest import write_sentiment

    train = write_sentiment(tmp_path / "train.tsv", 8)
    out = tmp_path / "lora"
    finetune(task="classification", model="acme/tiny-bert", train=str(train), dev=str(train), out=str(out), epochs=1,
             batch_size=4, progress=False, device="cpu", lora_rank=2)
    config = json.loads((out / "model" / "adapter_config.json").read_text(encoding="utf-8"))
    assert (config["base_model_name_or_path"], config["revision"]) == ("acme/tiny-bert", SHA)
    peft = pytest.importorskip("peft")
    assert peft.PeftConfig.from_pretrained(str(out / "model")).revision == SHA  # PEFT reads it the same way
    (cache / "refs" / "main").write_text(OLD_SHA)  # the branch moves on
    base, _ = adapted_config(out / "model")
    assert base == f"acme/tiny-bert@{SHA}" and model_path(base) == cache / "snapshots" / SHA
    local = tmp_path / "local-lora"
    finetune(task="classification", model=str(cache / "snapshots" / SHA), train=str(train), dev=str(train), out=str(local),
             epochs=1, batch_size=4, progress=False, device="cpu", lora_rank=2)
    config = json.loads((local / "model" / "adapter_config.json").read_text(encoding="utf-8"))
    assert config["revision"] is None and config["base_model_name_or_path"] == str(cache / "snapshots" / SHA)
