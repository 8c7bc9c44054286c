"""Several processes under `torchrun`: the model every trainer wraps for them (DDP, or FSDP per block and whole),
and torch.compile on top when asked. The trainers' data readers split each global batch by rank themselves:

* pretraining's readers give each rank its own documents (`--batch-size` is per process);
* fine-tuning draws the one-process batches on every rank and each rank takes its share
  (`finetune.trainer.rank_share`: `--batch-size` is the global batch); rank 0 evaluates the dev set and every rank
  learns the metrics (`system.from_main`);
* embedding training gives each rank a contiguous share and gathers the embeddings with their gradient, so the
  in-batch losses see the whole global batch (`embeddings_train/parallel.py`).

A refusal on any rank is one on all (`system.on_main`, `on_every_rank`, `all_ranks_agree`).
"""

from __future__ import annotations

import torch

from ..core.errors import BertforgeError
from ..core.system import Runtime


def wrap_model(model: torch.nn.Module, rt: Runtime, fsdp: bool = False, compile: bool = False) -> torch.nn.Module:
    """DDP (or FSDP, per layer and whole) when several processes run, then torch.compile if asked."""
    wrapped: torch.nn.Module = model
    if fsdp:
        if not rt.distributed:
            raise BertforgeError("--fsdp needs several processes: launch with torchrun --nproc-per-node N")
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks():  # type: ignore[operator]
            fully_shard(block)
        fully_shard(model)
    elif rt.distributed:
        from torch.nn.parallel import DistributedDataParallel

        ids = [rt.local_rank] if rt.device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=ids)
    if compile:
        wrapped = torch.compile(wrapped)  # type: ignore[assignment]  # of a Module: an OptimizedModule, a Module
    return wrapped
