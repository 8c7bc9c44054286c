"""Several processes under `torchrun`: the model every trainer wraps for them (DDP, or FSDP per block and whole),
and torch.compile on top when asked. The trainers' data readers split each global batch by rank themselves."""

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
