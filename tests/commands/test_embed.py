"""`bertforge embed` (`bertforge.commands.embed`): the vectors it writes and what each of its options changes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertModel
from bertforge.cli import main
from bertforge.core.linear import int8_available
from bertforge.tokenizer import Tokenizer
from tests.embed_layer_helpers import TEXTS as LAYER_TEXTS
from tests.embed_layer_helpers import TOL, VOCAB, family_checkpoints, reference_embeddings
from tests.helpers import write_uncased_tokenizer
from tests.model.test_quantize import TEXTS as INT8_TEXTS
from tests.model.test_quantize import cosines

# model_dir (a tiny random BertModel with its tokenizer) and int8_models (tests/model/test_quantize.py's tiny models):
# fixtures of tests/commands/conftest.py

needs_int8 = pytest.mark.skipif(not int8_available(), reason="this PyTorch has no dynamic int8 linear kernels")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """The tiny BERT checkpoint that `transformers` saved (`tests/embed_layer_helpers.py`), and that model."""
    pytest.importorskip("transformers")
    return family_checkpoints(tmp_path_factory, ("bert",))


TEXTS = ["river stone light", "the castle", "unbelievable lighthouses wanderings in the golden morning", "ship"]


def reference_states(model_dir: Path, texts: list[str]) -> tuple[list[torch.Tensor]]:
    """Last hidden states of each text on its own, by the model directly (no batching, no padding)."""
    tok = Tokenizer.from_pretrained(model_dir)
    model = BertModel.from_pretrained(model_dir).eval()
    states = []
    with torch.no_grad():
        for text in texts:
            enc = tok(text)
            states.append(model(torch.tensor([enc["input_ids"]]), token_type_ids=torch.tensor([enc["token_type_ids"]]))
                          .last_hidden_state[0])
    return states


def embed(tmp_path: Path, model_dir: Path, texts: list[str] | None, *argv: str, input: Path | None = None) -> np.ndarray:
    if input is None:
        input = tmp_path / "texts.txt"
        input.write_text("\n".join(texts) + "\n")
    output = tmp_path / f"out{len(list(tmp_path.glob('out*.npy')))}.npy"
    assert main(["embed", "--model", str(model_dir), "--input", str(input), "--out", str(output),
                 "--no-progress", *argv]) == 0
    return np.load(output)


def test_embed_pooling_and_normalize(tmp_path, model_dir, capsys):
    states = reference_states(model_dir, TEXTS)
    mean = torch.stack([s.mean(0) for s in states]).numpy()  # [CLS] and [SEP] included
    cls = torch.stack([s[0] for s in states]).numpy()
    assert np.allclose(embed(tmp_path, model_dir, TEXTS), mean, atol=1e-5)  # default: mean, not normalised
    assert np.allclose(embed(tmp_path, model_dir, TEXTS, "--pooling", "mean"), mean, atol=1e-5)
    assert np.allclose(embed(tmp_path, model_dir, TEXTS, "--pooling", "cls"), cls, atol=1e-5)
    assert not np.allclose(cls, mean, atol=1e-3)
    normalized = embed(tmp_path, model_dir, TEXTS, "--normalize")
    assert np.allclose(np.linalg.norm(normalized, axis=1), 1.0, atol=1e-5)
    assert np.allclose(normalized, mean / np.linalg.norm(mean, axis=1, keepdims=True), atol=1e-5)
    assert not np.allclose(np.linalg.norm(mean, axis=1), 1.0, atol=1e-2)
    raw = embed(tmp_path, model_dir, TEXTS, "--pooling", "cls", "--no-normalize")
    assert np.allclose(raw, cls, atol=1e-5)


def test_embed_no_normalize_overrides_a_sentence_transformers_default(tmp_path, model_dir, capsys):
    st_dir = tmp_path / "st"
    st_dir.mkdir()
    for path in model_dir.iterdir():
        (st_dir / path.name).write_bytes(path.read_bytes())
    (st_dir / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (st_dir / "1_Pooling").mkdir()
    (st_dir / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    assert np.allclose(np.linalg.norm(embed(tmp_path, st_dir, TEXTS), axis=1), 1.0, atol=1e-5)
    raw = embed(tmp_path, st_dir, TEXTS, "--no-normalize")
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-2)


def test_embed_text_key_reads_that_key_of_jsonl(tmp_path, model_dir, capsys):
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"text": "ship", "body": body}) + "\n" for body in TEXTS))
    expected = torch.stack([s.mean(0) for s in reference_states(model_dir, TEXTS)]).numpy()
    assert np.allclose(embed(tmp_path, model_dir, None, "--text-column", "body", input=data), expected, atol=1e-5)
    default = embed(tmp_path, model_dir, None, input=data)  # the "text" key: "ship" every time
    assert np.allclose(default, np.repeat(expected[3:4], len(TEXTS), axis=0), atol=1e-5)


def test_embed_reads_the_text_column_of_parquet_and_arrow(tmp_path, model_dir, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist([{"id": i, "body": body} for i, body in enumerate(TEXTS)])
    pq.write_table(table, tmp_path / "texts.parquet", row_group_size=2)
    feather.write_feather(table, tmp_path / "texts.feather")
    expected = torch.stack([s.mean(0) for s in reference_states(model_dir, TEXTS)]).numpy()
    for name in ("texts.parquet", "texts.feather"):
        got = embed(tmp_path, model_dir, None, "--text-column", "body", input=tmp_path / name)
        assert np.allclose(got, expected, atol=1e-5), name
    out = tmp_path / "o.npy"
    assert main(["embed", "--model", str(model_dir), "--input", str(tmp_path / "texts.parquet"), "--out",
                 str(out)]) == 2
    assert "texts.parquet, row 1: no column 'text' (--text-column names it)" in capsys.readouterr().err


def test_embed_max_batch_tokens_caps_the_real_tokens_per_batch(tmp_path, model_dir, capsys, monkeypatch):
    from bertforge.pipelines import base

    batches: list[list[int]] = []
    real = base.make_batches

    def recording(lengths, max_batch_tokens, batch_size):
        made = real(lengths, max_batch_tokens, batch_size)
        batches.append([(len(b), sum(lengths[i] for i in b)) for b in made])
        return made

    monkeypatch.setattr(base, "make_batches", recording)
    whole = embed(tmp_path, model_dir, TEXTS * 3)
    assert len(batches[-1]) == 1  # 4096 tokens: one batch
    small = embed(tmp_path, model_dir, TEXTS * 3, "--max-batch-tokens", "16")
    # at most 16 real tokens a batch, or one text that is longer on its own
    assert len(batches[-1]) > 3 and all(tokens <= 16 or n == 1 for n, tokens in batches[-1])
    assert any(n > 1 for n, _ in batches[-1])
    assert np.allclose(whole, small, atol=1e-5)


def test_embed_threads_sets_the_torch_threads(tmp_path, model_dir, capsys):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        embed(tmp_path, model_dir, TEXTS, "--threads", "1")
        assert torch.get_num_threads() == 1
        embed(tmp_path, model_dir, TEXTS, "--threads", "2")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------------- --layer
def test_cli_embed_layer(tmp_path, checkpoints, capsys):
    directory, reference = checkpoints["bert"]
    model_dir = tmp_path / "model"
    reference.save_pretrained(model_dir)
    write_uncased_tokenizer(model_dir, VOCAB)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(LAYER_TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "layer1.npy"
    assert main(["embed", "--model", str(model_dir), "--input", str(texts), "--out", str(out), "--layer", "1",
                 "--no-normalize", "--pooling", "mean"]) == 0
    assert "mean pooling of layer 1" in capsys.readouterr().err
    rows = [f.input_ids for f in bertforge.pipeline("embed", model=model_dir).features(LAYER_TEXTS)[0]]
    assert np.abs(np.load(out) - reference_embeddings(reference, rows, 1)).max() <= TOL
    assert main(["embed", "--model", str(model_dir), "--input", str(texts), "--out", str(tmp_path / "no.npy"),
                 "--layer", "-5"]) == 2
    assert "layer must be an integer in -4..3" in capsys.readouterr().err
    assert not (tmp_path / "no.npy").exists()


# ---------------------------------------------------------------------------------------------------- --quantize
@needs_int8
def test_embed_cli_quantize(int8_models, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("\n".join(INT8_TEXTS) + "\n", encoding="utf-8")
    for name, extra in (("fp32.npy", []), ("int8.npy", ["--quantize", "int8"])):
        assert main(["embed", "--model", str(int8_models["embed"]), "--input", str(tmp_path / "in.txt"),
                     "--out", str(tmp_path / name), *extra]) == 0
    assert "int8" in capsys.readouterr().err
    fp32, int8 = np.load(tmp_path / "fp32.npy"), np.load(tmp_path / "int8.npy")
    assert cosines(int8, fp32).min() > 0.99 and not np.array_equal(int8, fp32)


def test_cli_embed_txt_and_jsonl(tmp_path, minilm_dir, minilm_embed, capsys):
    txt = tmp_path / "in.txt"
    txt.write_text("hello world\n\nthird line\r\n", encoding="utf-8")
    assert main(["embed", "--model", str(minilm_dir), "--input", str(txt), "--out", str(tmp_path / "a.npy")]) == 0
    vectors = np.load(tmp_path / "a.npy")
    assert vectors.shape == (3, 384) and np.abs(vectors - minilm_embed(["hello world", "", "third line"])).max() < 1e-6
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"text": "hello world"}\n\n"third line"\n', encoding="utf-8")
    assert main(["embed", "--model", str(minilm_dir), "--input", str(jsonl), "--out", str(tmp_path / "b.npy")]) == 0
    assert np.abs(np.load(tmp_path / "b.npy") - vectors[[0, 2]]).max() < 1e-6
    assert "2 texts ->" in capsys.readouterr().err


def test_cli_embed_puts_the_named_prompt_or_the_given_one_before_every_text(tmp_path, minilm_dir, capsys):
    """--prompt-name picks a prompt of the model's config_sentence_transformers.json, --prompt gives one; the vectors
    are the pipeline's with that prompt; both at once is refused by the parser."""
    import shutil

    model = tmp_path / "prompted"
    shutil.copytree(minilm_dir, model)
    (model / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"search_query": "search_query: "}, "default_prompt_name": None}))
    texts = tmp_path / "in.txt"
    texts.write_text("hello world\nthird line\n", encoding="utf-8")
    argv = ["embed", "--model", str(model), "--input", str(texts), "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "named.npy"), "--prompt-name", "search_query"]) == 0
    assert main([*argv, "--out", str(tmp_path / "given.npy"), "--prompt", "search_query: "]) == 0
    expected = bertforge.pipeline("embed", model=model, prompt_name="search_query")(["hello world", "third line"])
    assert np.abs(np.load(tmp_path / "named.npy") - expected).max() < 1e-6
    assert np.abs(np.load(tmp_path / "given.npy") - expected).max() < 1e-6
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--out", str(tmp_path / "both.npy"), "--prompt", "x", "--prompt-name", "search_query"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, name, message",
    [
        (b"caf\xe9 au lait\n", "latin1.txt", "not UTF-8 text (byte 0xe9 at offset 3, line 1)"),
        (b'{"text": 1}\n', "bad.jsonl", "line 1: expected a JSON string or an object"),
        (b"{oops\n", "bad2.jsonl", "line 1: not valid JSON"),
        (b"x\n", "in.csv", "input must be a .txt"),
    ],
)
def test_cli_embed_bad_input(tmp_path, minilm_dir, capsys, content, name, message):
    path = tmp_path / name
    path.write_bytes(content)
    assert main(["embed", "--model", str(minilm_dir), "--input", str(path), "--out", str(tmp_path / "o.npy")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not (tmp_path / "o.npy").exists()


def test_embed_predict_and_evaluate_keep_freed_memory_for_reuse(tmp_path, model_dir, monkeypatch, capsys):
    """The inference commands ask for glibc's reuse of freed memory, as training does (int8 layers write fresh
    tensors; without it each is new pages: 1.36x against 1.80x float32's speed, all-MiniLM-L6-v2, 2026-11-25)."""
    import bertforge.core.system

    calls = []
    monkeypatch.setattr(bertforge.core.system, "reuse_freed_memory", lambda choice=None: calls.append(choice) or True)
    embed(tmp_path, model_dir, ["a small test"])
    assert calls == [None]
    missing = ["--task", "classification", "--model", str(tmp_path / "nowhere")]  # refused after the call
    assert main(["evaluate", *missing, "--input", str(tmp_path / "none.tsv")]) == 2
    assert main(["predict", *missing, "--input", str(tmp_path / "none.tsv"), "--out", str(tmp_path / "p.jsonl")]) == 2
    assert calls == [None, None, None]


# ---------------------------------------------------------------------------------------------------- --out DIR
def shard_table(out: Path, k: int = 0):
    import pyarrow.parquet as pq

    return pq.read_table(out / f"shard-{k:05d}.parquet")


def test_embed_out_dir_writes_shards_with_every_shard_option(tmp_path, model_dir, capsys):
    """--out DIR with --id-column, --shard-rows, --vector-dtype, --sort-window, --skip-bad-rows; the vectors are the
    .npy path's."""
    pytest.importorskip("pyarrow")
    from bertforge.pipelines.embed_corpus import read_embeddings

    data = tmp_path / "in.jsonl"
    rows = [{"key": f"k{i}", "body": text} for i, text in enumerate(TEXTS * 3)] + [{"key": "k0", "body": "dup"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["embed", "--model", str(model_dir), "--input", str(data), "--text-column", "body", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "ref.npy")]) == 0
    reference = np.load(tmp_path / "ref.npy")[:-1]
    assert main([*argv, "--out", str(tmp_path / "refused"), "--id-column", "key"]) == 2
    assert "in.jsonl, line 13: duplicate id 'k0' (an earlier row has it); --skip-bad-rows" in capsys.readouterr().err
    out = tmp_path / "vectors"
    assert main([*argv, "--out", str(out), "--id-column", "key", "--shard-rows", "5", "--vector-dtype", "float16",
                 "--sort-window", "3", "--skip-bad-rows"]) == 0
    assert "12 rows -> " in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert [s["count"] for s in manifest["shards"]] == [5, 5, 2] and manifest["rows"]["skipped"] == {"duplicate id": 1}
    assert manifest["vector_dtype"] == "float16" and shard_table(out).column("id").to_pylist()[:2] == ["k0", "k1"]
    ids, vectors = read_embeddings(out)
    assert ids.tolist() == [f"k{i}" for i in range(12)] and np.abs(vectors - reference).max() < 1e-2


def test_embed_resume_continues_with_the_runs_settings(tmp_path, model_dir, capsys, monkeypatch):
    pytest.importorskip("pyarrow")
    from bertforge.pipelines import embed_corpus

    data = tmp_path / "in.txt"
    data.write_text("\n".join(TEXTS * 4) + "\n")
    out = tmp_path / "vectors"
    argv = ["embed", "--model", str(model_dir), "--input", str(data), "--out", str(out), "--shard-rows", "4",
            "--no-progress"]
    assert main([*argv[:-1], "--out", str(tmp_path / "whole"), "--no-progress"]) == 0
    real, calls = embed_corpus.write_shard, []

    def fail_third(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(*args)

    monkeypatch.setattr(embed_corpus, "write_shard", fail_third)
    assert main(argv) == 130
    monkeypatch.setattr(embed_corpus, "write_shard", real)
    assert main(["embed", "--resume", "--out", str(out), "--pooling", "cls"]) == 2
    assert "the settings differ from the run's (pooling was None, is 'cls')" in capsys.readouterr().err
    assert main(["embed", "--resume", "--out", str(out), "--no-progress"]) == 0
    assert f"8 rows -> {out} (2 shard(s) written, 2 complete before; 0 bad rows" in capsys.readouterr().err
    for k in range(4):
        assert shard_table(out, k).equals(shard_table(tmp_path / "whole", k))


def test_embed_num_shards_and_shard_index_split_the_run(tmp_path, model_dir, capsys):
    pytest.importorskip("pyarrow")
    data = tmp_path / "in.txt"
    data.write_text("\n".join(TEXTS * 3) + "\n")
    argv = ["embed", "--model", str(model_dir), "--input", str(data), "--shard-rows", "3", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "one")]) == 0
    for index in ("1", "0"):
        assert main([*argv, "--out", str(tmp_path / "two"), "--num-shards", "2", "--shard-index", index]) == 0
    err = capsys.readouterr().err
    assert "the manifest waits for the other processes' shards" in err and err.count("manifest.json written") == 2
    for k in range(4):
        assert shard_table(tmp_path / "two", k).equals(shard_table(tmp_path / "one", k))
    assert main([*argv, "--out", str(tmp_path / "bad"), "--num-shards", "2", "--shard-index", "2"]) == 2
    assert "shard index 2 is not in 0..1" in capsys.readouterr().err


def test_embed_npy_output_refuses_the_shard_options_and_a_folder(tmp_path, model_dir, capsys):
    data = tmp_path / "in.txt"
    data.write_text("a\n")
    argv = ["embed", "--model", str(model_dir), "--input", str(data), "--out", str(tmp_path / "v.npy")]
    assert main([*argv, "--resume", "--vector-dtype", "int8"]) == 2
    assert "--vector-dtype, --resume: for shards in a directory (--out DIR)" in capsys.readouterr().err
    assert main(["embed", "--model", str(model_dir), "--input", str(tmp_path), "--out", str(tmp_path / "v.npy")]) == 2
    assert "is a folder: embed it into shards, --out DIR" in capsys.readouterr().err
    assert main(["embed", "--out", str(tmp_path / "dir")]) == 2
    assert "missing required option(s): --model, --input" in capsys.readouterr().err
    assert not (tmp_path / "v.npy").exists()


@needs_int8
def test_embed_out_dir_quantize_int8(int8_models, tmp_path, capsys):
    pytest.importorskip("pyarrow")
    from bertforge.pipelines.embed_corpus import read_embeddings

    (tmp_path / "in.txt").write_text("\n".join(INT8_TEXTS) + "\n", encoding="utf-8")
    argv = ["embed", "--model", str(int8_models["embed"]), "--input", str(tmp_path / "in.txt"), "--quantize", "int8",
            "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "int8.npy")]) == 0
    assert main([*argv, "--out", str(tmp_path / "shards")]) == 0
    assert json.loads((tmp_path / "shards" / "manifest.json").read_text())["quantize"] == "int8"
    assert np.abs(read_embeddings(tmp_path / "shards")[1] - np.load(tmp_path / "int8.npy")).max() < 1e-5


def test_embed_precision_is_the_models_compute_in_both_outputs(tmp_path, model_dir, capsys):
    """--precision bf16 runs the encoder under bf16 (the pipelines' `precision`), for the .npy and the shards; the
    stored dtype is --vector-dtype's, a separate option."""
    pytest.importorskip("pyarrow")
    from bertforge.pipelines.embed_corpus import read_embeddings

    data = tmp_path / "in.txt"
    data.write_text("\n".join(TEXTS * 2) + "\n")
    argv = ["embed", "--model", str(model_dir), "--input", str(data), "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "fp32.npy")]) == 0
    assert main([*argv, "--out", str(tmp_path / "bf16.npy"), "--precision", "bf16"]) == 0
    fp32, bf16 = np.load(tmp_path / "fp32.npy"), np.load(tmp_path / "bf16.npy")
    assert bf16.dtype == np.float32 and 0 < np.abs(bf16 - fp32).max() < 0.1  # bf16's rounding, stored as float32
    assert main([*argv, "--out", str(tmp_path / "shards"), "--precision", "bf16"]) == 0
    _, vectors = read_embeddings(tmp_path / "shards")
    np.testing.assert_allclose(vectors, bf16, atol=1e-6)
    run = json.loads((tmp_path / "shards" / "embed-run.json").read_text())
    assert run["settings"]["precision"] == "bf16" and run["settings"]["vector_dtype"] == "float32"
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--out", str(tmp_path / "x.npy"), "--precision", "fp16"])
    assert refused.value.code == 2 and "--precision: invalid choice: 'fp16'" in capsys.readouterr().err
