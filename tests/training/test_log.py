"""`bertforge.training.log`: metrics.jsonl rows are strict JSON (non-finite values null and named), a resumed run's
log drops the rows after its checkpoint, and the curves are drawn into a PNG; without the `plots` extra
(matplotlib, tensorboard) the rows are still written and one line says what is skipped."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np

from bertforge.training.log import MetricsLog, Panel, plot_curves, read_rows, strict_json_row


def test_non_finite_values_become_null_and_are_named():
    row = {"step": 3, "loss": float("nan"), "lr": 1e-3, "per_type": {"PER": float("inf"), "LOC": 0.5},
           "norms": [1.0, float("-inf")], "accuracy": np.float32(0.25)}
    clean = strict_json_row(row)
    assert clean == {"step": 3, "loss": None, "lr": 1e-3, "per_type": {"PER": None, "LOC": 0.5}, "norms": [1.0, None],
                     "accuracy": 0.25, "nonfinite": ["loss", "per_type.PER", "norms.1"]}
    json.dumps(clean, allow_nan=False)  # strict JSON
    assert strict_json_row({"step": 1, "loss": 2.0}) == {"step": 1, "loss": 2.0}  # nothing to name


def test_a_resumed_log_keeps_the_rows_up_to_its_checkpoint(tmp_path):
    file = tmp_path / "metrics.jsonl"
    with MetricsLog(file) as log:
        for step in (2, 4, 6, 8):
            log.write({"step": step, "loss": 1.0 / step})
        log.write({"step": 8, "type": "eval", "accuracy": float("nan")})
    rows = read_rows(file)
    assert [r["step"] for r in rows] == [2, 4, 6, 8, 8] and rows[-1] == {"step": 8, "type": "eval", "accuracy": None,
                                                                         "nonfinite": ["accuracy"]}
    with MetricsLog(file, resume_step=4) as log:  # resumed from the step-4 checkpoint
        log.write({"step": 6, "loss": 0.5})
    assert [(r["step"], r["loss"]) for r in read_rows(file)] == [(2, 0.5), (4, 0.25), (6, 0.5)]
    with MetricsLog(file, enabled=False) as log:  # the log of a rank other than 0 writes nothing
        log.write({"step": 7, "loss": 0.1})
    assert len(read_rows(file)) == 3


def test_the_curves_are_a_png(tmp_path):
    rows = [{"step": s, "type": "train", "loss": 5.0 - s} for s in range(1, 5)]
    rows.append({"step": 4, "type": "eval", "eval_loss": 2.0})
    png = tmp_path / "curves.png"
    plot_curves(rows, png, [Panel("loss", ["loss"], kind="train"), Panel("held out", ["eval_loss"], marker="o")],
                title="tiny run")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and [p.name for p in tmp_path.iterdir()] == ["curves.png"]


def _without_plots(monkeypatch):
    """As if the `plots` extra were not installed: matplotlib and tensorboard cannot be imported."""
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg",
                 "tensorboard", "torch.utils.tensorboard"):
        monkeypatch.setitem(sys.modules, name, None)


def test_without_the_plots_extra_a_run_logs_its_rows_and_says_once_what_it_skips(tmp_path, monkeypatch, caplog):
    _without_plots(monkeypatch)
    with caplog.at_level(logging.DEBUG, logger="bertforge"):
        with MetricsLog(tmp_path / "metrics.jsonl", tensorboard=tmp_path / "tensorboard") as log:
            log.write({"step": 1, "loss": 2.0})
            log.write({"step": 2, "loss": 1.5})
        drawn = plot_curves(read_rows(tmp_path / "metrics.jsonl"), tmp_path / "curves.png", [Panel("loss", ["loss"])])
    assert [r["loss"] for r in read_rows(tmp_path / "metrics.jsonl")] == [2.0, 1.5]
    assert not drawn and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no PNG, no tensorboard/
    told = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in told] == [
        "tensorboard and matplotlib are not installed: no TensorBoard logs and no curves PNG "
        "(pip install 'bertforge[plots]'); metrics.jsonl has every row"]
    assert not any(r.exc_info for r in caplog.records)


def test_with_the_plots_extra_a_run_writes_tensorboard_and_says_nothing(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        with MetricsLog(tmp_path / "metrics.jsonl", tensorboard=tmp_path / "tensorboard") as log:
            log.write({"step": 1, "loss": 2.0})
    assert any((tmp_path / "tensorboard").iterdir()) and not caplog.records


def test_the_plots_extra_is_imported_only_when_used():
    code = ("import sys, bertforge, bertforge.cli, bertforge.commands.pretrain, bertforge.commands.attention, "
            "bertforge.pretrain.trainer, bertforge.finetune.trainer, bertforge.training.log\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'tensorboard')"
            " or m.startswith('torch.utils.tensorboard')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
