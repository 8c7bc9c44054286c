"""Run under `torchrun --nproc-per-node W`: a few pretraining steps on given rows, for the equivalence tests in
tests/pretrain/test_trainer_equivalence.py (not a test module itself).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/pretrain/rows_worker.py SPEC.json

SPEC.json: {"rows": ROWS.safetensors, "args": {PretrainArgs fields}, "modes": ["ddp", "fsdp"], "out": DIR}.
ROWS.safetensors holds the global batches, each tensor [steps, W x batch_size, ...]; rank r trains on rows
r x batch_size .. (r + 1) x batch_size of each (its own slice, as a sampler that splits the global batch would).
For each mode, a `Pretrainer` (DDP, or FSDP with `fsdp=True`) runs `steps` train steps; rank 0 writes
DIR/MODE/steps.json (what `train_step` returned, per step) and DIR/MODE/weights.safetensors (the full weights).
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from bertforge.pretrain.trainer import PretrainArgs, Pretrainer, teardown_runtime


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    rows = load_file(spec["rows"])
    steps = next(iter(rows.values())).shape[0]
    rt = None
    for mode in spec["modes"]:
        out = Path(spec["out"]) / mode
        trainer = Pretrainer(PretrainArgs(**spec["args"], out=str(out), fsdp=mode == "fsdp"))
        rt = rt or trainer.rt  # the first trainer's runtime owns the process group
        rank, b = trainer.rt.rank, trainer.args.batch_size
        assert trainer.rt.world_size * b == next(iter(rows.values())).shape[1], "rows do not split evenly"
        trainer.stream = iter([{k: v[s, rank * b:(rank + 1) * b] for k, v in rows.items()} for s in range(steps)])
        results = [trainer.train_step() for _ in range(steps)]
        weights = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            (out / "steps.json").write_text(json.dumps(results))
            save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "weights.safetensors"))
        torch.distributed.barrier()
        del trainer, weights
    # every model (DDP's reducer, FSDP's state) lets go of the process group before it is destroyed; left to
    # interpreter exit, gloo's worker threads sometimes abort the process ("terminate called without an active
    # exception") after a run that succeeded: 2 in 25 runs on a loaded 2-core machine
    gc.collect()
    teardown_runtime(rt)


if __name__ == "__main__":
    main(sys.argv[1])
