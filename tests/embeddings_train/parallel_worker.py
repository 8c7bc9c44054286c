"""Run under `torchrun --nproc-per-node W`: `bertforge train-embeddings ARGS`, for the two-process tests in
tests/embeddings_train/test_parallel.py (not a test module itself).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/embeddings_train/parallel_worker.py ARGS

With STOP_AFTER_STEP=N in the environment, every process ends (exit code 3, no clean-up: as if killed) right after
optimizer step N, once the step's collectives are done.
"""

from __future__ import annotations

import os
import sys

from bertforge.cli import main
from bertforge.training.step import TrainStep

STOPPED = 3


def stop_after(step: int) -> None:
    real = TrainStep.run

    def run_then_stop(self, *args, **kwargs):
        outcome = real(self, *args, **kwargs)
        if self.step == step:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(STOPPED)
        return outcome

    TrainStep.run = run_then_stop  # type: ignore[method-assign]


if __name__ == "__main__":
    if os.environ.get("STOP_AFTER_STEP"):
        stop_after(int(os.environ["STOP_AFTER_STEP"]))
    sys.exit(main(sys.argv[1:]))
