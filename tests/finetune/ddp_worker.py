"""Run under `torchrun --nproc-per-node W`: fine-tuning runs through the Python API or the command line, for
tests/finetune/test_api_distributed.py (not a test module itself).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/finetune/ddp_worker.py SPEC.json

SPEC.json: {"results": DIR, "runs": [{"name": NAME, "call": "finetune" | "cli", "settings": {finetune's keywords} |
"argv": [...], "stop_after": N}]}. A "finetune" run with `stop_after` is stopped right after its checkpoint at step N
(an exception on every rank, as a kill would stop it) and then resumed (resume=True) to its end. Each rank writes
DIR/NAME-rank-R.json (what `finetune` returned) or DIR/NAME-rank-R.txt (what `bertforge.cli.main` printed: under
torchrun the command line ends the process when its command is done, so a "cli" run comes last).
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
from pathlib import Path

from bertforge.cli import main as cli_main
from bertforge.core.system import setup_runtime, teardown_runtime
from bertforge.finetune import finetune
from bertforge.finetune.trainer import Finetuning


class Stopped(Exception):
    """The simulated kill of a run, raised on every rank after the same checkpoint."""


def stopped_after(step: int):
    """`Finetuning.save_checkpoint`, stopping the run once the checkpoint of `step` is written."""
    save = Finetuning.save_checkpoint

    def save_then_stop(self: Finetuning) -> None:
        save(self)
        if self.stepper.step == step:
            raise Stopped(f"stopped after the checkpoint of step {step}")

    return save, save_then_stop


def run_finetune(run: dict) -> dict:
    if "stop_after" not in run:
        return finetune(**run["settings"])
    save, save_then_stop = stopped_after(run["stop_after"])
    Finetuning.save_checkpoint = save_then_stop
    try:
        finetune(**run["settings"])
        raise AssertionError("the run was not stopped")
    except Stopped:
        pass
    finally:
        Finetuning.save_checkpoint = save
    gc.collect()  # the stopped run's DDP wrapper
    return finetune(**run["settings"], resume=True)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    rt = setup_runtime("cpu")  # owns the process group every run joins
    for run in spec["runs"]:
        result = Path(spec["results"], f"{run['name']}-rank-{rt.rank}")
        if run["call"] == "cli":
            with open(result.with_suffix(".txt"), "w", encoding="utf-8") as printed, contextlib.redirect_stdout(printed):
                cli_main(run["argv"])  # flushes `printed` and ends the process
        result.with_suffix(".json").write_text(json.dumps(run_finetune(run)))
        gc.collect()
    teardown_runtime(rt)


if __name__ == "__main__":
    main(sys.argv[1])
