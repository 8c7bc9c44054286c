"""`bertforge export-onnx` (`bertforge.commands.export_onnx`): the file it writes, its options and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.cli import main
from tests.model.test_onnx import tiny_checkpoint

transformers = pytest.importorskip("transformers", reason="the ONNX tests need transformers: pip install -e '.[test]'")
ort = pytest.importorskip("onnxruntime", reason="the ONNX tests need onnxruntime: pip install -e '.[test]'")
onnx = pytest.importorskip("onnx", reason="the ONNX tests need onnx: pip install -e '.[test]'")


def test_cli_export_onnx_and_errors(tmp_path, capsys):
    directory, _ = tiny_checkpoint(tmp_path, "BertForSequenceClassification")
    out = tmp_path / "cls.onnx"
    assert main(["export-onnx", "--model", str(directory), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert out.is_file() and "BertForSequenceClassification" in err and "onnxruntime agrees on 4 shapes" in err
    assert main(["export-onnx", "--model", str(directory), "--out", str(tmp_path / "base.onnx"), "--model-class", "none"]) == 0
    assert "BertModel ->" in capsys.readouterr().err
    assert main(["export-onnx", "--model", str(directory), "--out", str(tmp_path / "x.pt")]) == 2
    assert "must end in .onnx" in capsys.readouterr().err
    assert main(["export-onnx", "--model", str(directory), "--out", str(tmp_path / "q.onnx"),
                 "--model-class", "BertForMaskedLM"]) == 2
    err = capsys.readouterr().err
    assert "has no BertForMaskedLM head weights (cls.predictions" in err and "Traceback" not in err
    assert not (tmp_path / "q.onnx").exists()
    assert main(["export-onnx", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "m.onnx")]) == 2
    assert "no such model directory" in capsys.readouterr().err


def test_cli_opset_and_no_check(tmp_path, capsys, monkeypatch):
    directory, _ = tiny_checkpoint(tmp_path, "BertModel")

    def opset(path: Path) -> int:
        return {o.domain: o.version for o in onnx.load(str(path)).opset_import}[""]  # "" is the ai.onnx domain

    assert main(["export-onnx", "--model", str(directory), "--out", str(tmp_path / "default.onnx")]) == 0
    assert opset(tmp_path / "default.onnx") == 17  # the documented default
    assert main(["export-onnx", "--model", str(directory), "--out", str(tmp_path / "o18.onnx"), "--opset", "18"]) == 0
    assert opset(tmp_path / "o18.onnx") == 18
    capsys.readouterr()

    def no_session(*args, **kwargs):
        raise AssertionError("onnxruntime was asked to run the model")

    monkeypatch.setattr(ort, "InferenceSession", no_session)
    assert main(["export-onnx", "--model", str(directory), "--out", str(tmp_path / "n.onnx"), "--no-check"]) == 0
    assert "not checked" in capsys.readouterr().err and opset(tmp_path / "n.onnx") == 17
    assert main(["export-onnx", "--model", str(directory), "--out", str(tmp_path / "c.onnx")]) == 1  # the check runs
