"""Tests of `bertforge.pipelines.base`: token-budget batches sorted by length, and features computed apart."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertforgeError
from bertforge.pipelines.base import make_batches
from tests.pipelines.pipelines_helpers import SENTENCES


def test_make_batches_sorts_and_respects_budget():
    lengths = [5, 30, 2, 30, 12, 7, 100]
    batches = make_batches(lengths, max_batch_tokens=40, batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        sizes = [lengths[i] for i in b]
        assert sizes == sorted(sizes, reverse=True)
        assert len(b) <= 3 and (sum(sizes) <= 40 or len(b) == 1)


def test_run_features_equals_the_call(heads, embed):
    """The entry point for callers that tokenize ahead (the server): features in, the same results out."""
    tc = bertforge.pipeline("text-classification", model=heads["tc"], top_k=None)
    items = ["Hi!", ("a question", "and its context"), SENTENCES[0], ("", "")]
    features, truncated = tc.features(items)
    assert truncated == 0 and sorted(f.item for f in features) == [0, 1, 2, 3]
    assert tc.run_features(items, features) == tc(items)
    features, _ = embed.features(SENTENCES)
    np.testing.assert_allclose(np.stack(embed.run_features(SENTENCES, features)), embed(SENTENCES), rtol=0, atol=1e-6)
    with pytest.raises(BertforgeError, match="input 1 is a int"):
        embed.features(["fine", 3])
    with pytest.raises(BertforgeError, match="outside the 1 given"):
        embed.run_features(SENTENCES[:1], features[:2])


def test_device_option_of_every_pipeline(minilm_dir, embed):
    """device= picks where a pipeline runs (#33): "cpu" is the default path exactly, a device the machine lacks or an
    unknown name is refused in one line, and on a CUDA machine the float16 GPU path agrees with the CPU's."""
    import torch
    on_cpu = bertforge.pipeline("embed", model=minilm_dir, device="cpu")
    assert on_cpu.device == torch.device("cpu") == embed.device
    assert np.array_equal(on_cpu(SENTENCES[:4]), embed(SENTENCES[:4]))
    with pytest.raises(BertforgeError, match="unknown device 'tpu'; choose cpu"):
        bertforge.pipeline("embed", model=minilm_dir, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(BertforgeError, match="device cuda was asked for, but no CUDA device is available"):
            bertforge.pipeline("fill-mask", model=minilm_dir, device="cuda")
        return
    on_gpu = bertforge.pipeline("embed", model=minilm_dir, device="cuda")
    assert next(on_gpu.model.parameters()).dtype == torch.float16
    assert np.abs(on_gpu(SENTENCES[:8]) - embed(SENTENCES[:8])).max() < 2e-2
    with pytest.raises(BertforgeError, match="int8 \\(quantize\\) runs on CPU"):
        bertforge.pipeline("embed", model=minilm_dir, device="cuda", quantize="int8")


def test_device_option_of_the_inference_commands(minilm_dir, tmp_path):
    from bertforge.cli import main
    texts = tmp_path / "in.txt"
    texts.write_text("hello\n", encoding="utf-8")
    for argv in (["embed", "--model", str(minilm_dir), "--input", str(texts), "--out", str(tmp_path / "o.npy")],
                 ["fill-mask", "--model", str(minilm_dir), "Paris is the [MASK] of France."]):
        assert main([*argv, "--device", "tpu"]) != 0
    assert main(["embed", "--model", str(minilm_dir), "--input", str(texts), "--out", str(tmp_path / "o.npy"),
                 "--device", "cpu"]) == 0
    assert np.load(tmp_path / "o.npy").shape == (1, 384)


def test_an_adapter_runs_on_its_base_given_or_found_in_float32_and_merged_in_int8(mlm_dir, tmp_path):
    """pipeline(task, model=BASE, adapter=DIR) and pipeline(task, model=DIR) compute what peft does on the
    `transformers` class; an adapter peft wrote (no tokenizer, no labels beside it) runs too; int8 merges first."""
    import torch

    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from bertforge.model import lora

    labels = {0: "neg", 1: "neu", 2: "pos"}
    torch.manual_seed(0)
    model = bertforge.BertForSequenceClassification.from_pretrained(
        mlm_dir, num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()})
    for adapter in lora.add_adapters(model, lora.LoraSettings(rank=4, targets=("query", "value", "ffn_out"))):
        torch.nn.init.normal_(adapter.lora_B, std=0.2)
    lora.save_adapter(model, tmp_path / "adapter", base=str(mlm_dir))

    hf = transformers.BertForSequenceClassification.from_pretrained(mlm_dir, num_labels=3)
    ref = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    tokens = transformers.AutoTokenizer.from_pretrained(mlm_dir)(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = ref(**tokens).logits.softmax(-1).numpy()

    def scores(pipe):
        return np.array([[r["score"] for r in sorted(out, key=lambda r: r["label"])] for out in pipe(SENTENCES)])

    given = bertforge.pipeline("text-classification", model=mlm_dir, adapter=tmp_path / "adapter", top_k=None)
    found = bertforge.pipeline("text-classification", model=tmp_path / "adapter", top_k=None)
    assert found(SENTENCES[0])[0]["label"] in labels.values()  # the labels, saved beside the adapter
    assert np.abs(scores(given) - want).max() < 1e-5 and np.abs(scores(found) - want).max() < 1e-5

    ref.save_pretrained(tmp_path / "peft")  # peft's own directory: weights and config only
    assert not (tmp_path / "peft" / "vocab.txt").exists()
    with pytest.raises(BertforgeError, match="load it with num_labels=N"):
        bertforge.pipeline("text-classification", model=tmp_path / "peft")
    theirs = lora.load_adapted(bertforge.BertForSequenceClassification, tmp_path / "peft", num_labels=3)
    pipe = bertforge.pipeline("text-classification", model=theirs, top_k=None,
                              tokenizer=bertforge.Tokenizer.from_pretrained(tmp_path / "peft"))  # the base's
    assert np.abs(scores(pipe) - want).max() < 1e-5

    int8 = bertforge.pipeline("text-classification", model=tmp_path / "adapter", top_k=None, quantize="int8")
    assert not lora.has_adapters(int8.model)
    assert np.abs(scores(int8) - want).max() < 0.05


def test_bf16_precision_stays_within_cosine_0999_of_float32(minilm_dir):
    """precision="bf16": the encoder under bf16 autocast, the results float32, every text's embedding within cosine
    0.999 of float32's (all-MiniLM-L6-v2; long and short texts); int8 with it, or a bad name, is refused."""
    texts = ["a short one.", "the quick brown fox jumps over the lazy dog " * 12, "bf16 rounds every product"]
    fp32 = bertforge.pipeline("embed", model=minilm_dir)(texts)
    bf16_pipe = bertforge.pipeline("embed", model=minilm_dir, precision="bf16")
    bf16 = bf16_pipe(texts)
    assert bf16.dtype == np.float32 and bf16_pipe.autocast_dtype is torch.bfloat16
    cosines = (fp32 * bf16).sum(1) / np.linalg.norm(fp32, axis=1) / np.linalg.norm(bf16, axis=1)
    assert cosines.min() >= 0.999 and not np.array_equal(fp32, bf16)  # bf16 did run: not float32's bits
    with pytest.raises(BertforgeError, match="precision bf16 is for float models; quantize='int8' runs int8 layers"):
        bertforge.pipeline("embed", model=minilm_dir, precision="bf16", quantize="int8")
    with pytest.raises(BertforgeError, match="precision 'fp16'; choose fp32 or bf16"):
        bertforge.pipeline("embed", model=minilm_dir, precision="fp16")


def test_compute_runs_the_encoder_at_bucketed_row_counts_with_the_exact_results(embed, monkeypatch):
    """Packed batches run at `bucket_size` rows (filler sequences appended), so a long-running pipeline meets few
    matrix sizes and its memory stays bounded; the results are those of the exact sizes."""
    import bertforge.pipelines.base as base
    from bertforge.model.attention import bucket_size

    bert = embed.model.base_model
    rows: list[tuple[int, int]] = []
    real = bert.forward_packed
    monkeypatch.setattr(bert, "forward_packed", lambda batch, *a: rows.append((batch.tokens, len(batch.lengths))) or real(batch, *a))
    texts = SENTENCES + [s[: 7 + i] for i, s in enumerate(SENTENCES)]
    bucketed = embed(texts)
    assert rows and all(t == bucket_size(t) for t, _ in rows)
    monkeypatch.setattr(base, "bucket_size", lambda tokens: tokens)
    exact_rows = len(rows)
    exact = embed(texts)
    assert any(t != bucket_size(t) for t, _ in rows[exact_rows:])  # the exact sizes were not all buckets already
    assert [n for _, n in rows[exact_rows:]] != [n for _, n in rows[:exact_rows]]  # the buckets carried fillers
    np.testing.assert_allclose(bucketed, exact, rtol=0, atol=1e-6)


def test_every_call_option_has_its_setter_and_a_bad_table_fails_at_class_creation():
    """The tables `call_options` / `refused_options` are checked when a pipeline class is made."""
    from bertforge.pipelines import PIPELINE_CLASSES, pipeline_class
    from bertforge.pipelines.base import Pipeline

    for task in PIPELINE_CLASSES:
        cls = pipeline_class(task)
        assert "batch_size" in cls.call_options and "num_workers" in cls.refused_options
        assert not set(cls.call_options) & set(cls.refused_options)
    with pytest.raises(TypeError, match=r"without a set_<name> method: \['colour'\]"):
        type("Bad", (Pipeline,), {"call_options": ("batch_size", "colour")})
    with pytest.raises(TypeError, match=r"both taken and refused: \['batch_size'\]"):
        type("Bad", (Pipeline,), {"refused_options": {"batch_size": "no"}})


def test_a_call_s_options_are_checked_before_any_work_and_leave_the_pipeline_as_it_was(embed):
    with pytest.raises(BertforgeError, match="embed: batch_size must be a positive integer, got 0"):
        embed(SENTENCES, batch_size=0)
    with pytest.raises(BertforgeError, match="max_length must be an integer in 3..512"):
        embed(SENTENCES, max_length=10**6)
    with pytest.raises(BertforgeError, match="progress must be True, False or None"):
        embed(SENTENCES, progress="yes")
    assert embed.with_options({}) is embed
    copy = embed.with_options({"batch_size": 3})
    assert copy is not embed and copy.batch_size == 3 and embed.batch_size == 256 and copy.model is embed.model
