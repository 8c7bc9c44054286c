"""Run under `torchrun --nproc-per-node W`: `bertforge train-embeddings ARGS`, for the two-process tests in
tests/embeddings_train/test_parallel.py (not a test module itself).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/embeddings_train/parallel_worker.py ARGS

With STOP_AFTER_STEP=N in the environment, every process ends (exit code 3, no clean-up: as if killed) right after
optimizer step N, once the step's collectives are done. With COUNT_GRAD_SYNCS=FILE, each rank writes to FILE.RANK
how many gradient buckets DDP all-reduced in the run (a communication hook that counts, then all-reduces as DDP's
default does).
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


def count_grad_syncs(path: str) -> None:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    calls = [0]
    real = DistributedDataParallel.__init__

    def counting(state, bucket):
        calls[0] += 1
        with open(f"{path}.{dist.get_rank()}", "w") as file:  # at each call: the command ends with os._exit
            file.write(str(calls[0]))
        return allreduce_hook(state, bucket)

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.register_comm_hook(None, counting)

    DistributedDataParallel.__init__ = init  # type: ignore[method-assign]


if __name__ == "__main__":
    if os.environ.get("COUNT_GRAD_SYNCS"):
        count_grad_syncs(os.environ["COUNT_GRAD_SYNCS"])
    if os.environ.get("STOP_AFTER_STEP"):
        stop_after(int(os.environ["STOP_AFTER_STEP"]))
    sys.exit(main(sys.argv[1:]))
