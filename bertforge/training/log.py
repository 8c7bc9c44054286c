"""What every trainer writes about a run: `metrics.jsonl` (one JSON object a row), TensorBoard scalars, and the
PNG of its curves. Pretraining and fine-tuning differ only in their rows and in the panels they plot.

TensorBoard and matplotlib are the `plots` extra, imported only when used: without them a run still writes
`metrics.jsonl`, and says once, in one line, what it skips and how to get it."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.io import atomic_write, atomic_write_text

log = logging.getLogger("bertforge")

#: How to add what draws (matplotlib: the curves PNG, `bertforge attention`) and TensorBoard's scalars.
PLOTS_HINT = "pip install 'bertforge[plots]'"


def installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module entry blocked (None)
        return False


class MetricsLog:
    """Rows appended to `file` (flushed each time) and, with `tensorboard`, written there as scalars tagged
    `<row type, default "train">/<key>`. Rows are strict JSON: a NaN or infinite value is written as `null` and
its key listed in the row's `"nonfinite"` (for example `"loss": null, "nonfinite": ["loss"]`). `resume_step`: a resumed run's step; rows after it are dropped from the
    file and from TensorBoard, so that the log reads as if the run had never stopped. `enabled=False` (ranks
    other than 0) writes nothing."""

    def __init__(self, file: Path, resume_step: int | None = None, tensorboard: Path | None = None,
                 enabled: bool = True) -> None:
        self.enabled = enabled
        self.file = file
        self.tb = None
        if not enabled:
            return
        if resume_step is not None and file.exists():
            kept = [line for line in file.read_text(encoding="utf-8").splitlines()
                    if line.strip() and (step := _row_step(line)) is not None and step <= resume_step]
            atomic_write_text(file, "".join(line + "\n" for line in kept))
        if tensorboard is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(tensorboard), purge_step=resume_step + 1 if resume_step else None)
            except ImportError:  # the `plots` extra is not installed
                pass
            _say_what_is_skipped(tensorboard=self.tb is None)
        self.fh = open(file, "a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = strict_json_row(row)
        self.fh.write(json.dumps(row, allow_nan=False) + "\n")
        self.fh.flush()
        if self.tb is not None:
            kind = row.get("type", "train")
            for k, v in row.items():
                if k not in ("step", "type") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(f"{kind}/{k}", v, row["step"])

    def close(self) -> None:
        if self.enabled:
            self.fh.close()
            if self.tb is not None:
                self.tb.close()

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def strict_json_row(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with every non-finite float (at any depth) replaced by None and the keys of those values, dotted for
    nested ones, listed under "nonfinite"; `row` itself when all its numbers are finite."""
    found: list[str] = []

    def clean(value: Any, key: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            found.append(key)
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, f"{key}.{i}") for i, v in enumerate(value)]
        if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # a numpy or torch scalar
            return clean(value.item(), key)
        return value

    cleaned = clean(row, "")
    if found:
        cleaned["nonfinite"] = found
    return cleaned


def _row_step(line: str) -> int | None:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def read_rows(file: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]


@dataclass
class Panel:
    """One plot of the curves PNG: a line per key, over the rows that have it (of `kind` only, when given)."""

    title: str
    keys: Sequence[str]
    kind: str | None = None  # the rows' "type" ("train", "eval"); None: every row
    ylim: tuple[float, float] | None = None
    marker: str | None = None


def _say_what_is_skipped(tensorboard: bool) -> None:
    """One line, when a run starts (its `MetricsLog` with TensorBoard asked for), naming what the missing `plots`
    extra skips."""
    missing = (["tensorboard"] if tensorboard else []) + ([] if installed("matplotlib") else ["matplotlib"])
    if missing:
        skipped = (["TensorBoard logs"] if tensorboard else []) + (["curves PNG"] if "matplotlib" in missing else [])
        log.warning("%s %s not installed: no %s (%s); metrics.jsonl has every row", " and ".join(missing),
                    "are" if len(missing) > 1 else "is", " and no ".join(skipped), PLOTS_HINT)


def plot_curves(rows: Iterable[dict[str, Any]], png: Path, panels: Sequence[Panel], title: str | None = None) -> bool:
    """The panels side by side against the optimizer step, one PNG written atomically (matplotlib's Agg canvas:
    no pyplot global state). Without matplotlib nothing is written and False returned: the run's `MetricsLog`
    has said so when it opened."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        log.debug("matplotlib is not installed: %s not drawn", png)
        return False

    rows = list(rows)
    figure = Figure(figsize=(5 * len(panels), 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for axis, panel in zip(axes, panels):
        for key in panel.keys:
            points = [(r["step"], r[key]) for r in rows
                      if r.get(key) is not None and (panel.kind is None or r.get("type") == panel.kind)]
            if points:
                axis.plot(*zip(*points), label=key, marker=panel.marker)
        axis.set(title=panel.title, xlabel="optimizer step")
        if panel.ylim is not None:
            axis.set_ylim(*panel.ylim)
        if axis.lines:
            axis.legend()
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    atomic_write(png, lambda tmp: figure.savefig(tmp, format="png"))
    return True
