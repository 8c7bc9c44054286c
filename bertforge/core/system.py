"""Process-wide settings, in one place: `setup_runtime` (device, process group, intra-op threads, the allocator for
training on CPU, the switches the environment sets) is what every command calls before it works.

The environment's switches (BERTFORGE_LINEAR, BERTFORGE_INT8_KERNEL, BERTFORGE_SKIP_MEMORY_CHECK) are read here and
nowhere else (`read_switches`), checked and handed to the modules they steer (`apply_switches`); a library user who
never calls `setup_runtime` has the defaults (the fastest kernels that compute the same, the memory check on).
`cli.main` applies the switches for every command, those that set up no runtime too.

`inference_device` is the device choice of the pipelines and the server. Under torchrun every rank takes the same
decisions through `all_ranks_agree`, `on_main` (a check on rank 0, its refusal raised everywhere), `on_every_rank`
and `from_main` (rank 0 computes, every rank learns the value).

glibc's malloc serves every request above 32 MiB (BERT's word-embedding gradient, the vocabulary logits, the
feed-forward activations of a large batch) with a fresh `mmap` and gives it back with `munmap` when freed. The
next step's tensor of the same size then starts from untouched pages, and the kernel zeroes each 4 KiB page on
first touch: filling the 94 MB zero gradient of BERT-base's word embeddings took 120 ms of a 3.5 s step here.
`reuse_freed_memory` makes glibc serve large requests from its heap and keep freed memory for reuse: a mini
training step then took 1 page fault instead of 57,000, and steps of mini and base ran 5-15 % faster at the same
peak memory (2026-11-23). `bertforge pretrain` and `bertforge finetune` turn it on when they train on CPU.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from .errors import BertforgeError

log = logging.getLogger("bertforge")

T = TypeVar("T")

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_MAX = -4
_applied = False


def reuse_freed_memory(choice: str | None = None) -> bool:
    """Ask glibc's malloc to keep freed memory for reuse (no `mmap` per large tensor, no trimming below 2 GiB).

    Returns whether the setting is in force. Does nothing where it does not apply or the user has chosen: not
    Linux, no glibc, `LD_PRELOAD` (another allocator), any `MALLOC_*` tunable in the environment, or
    `choice` "default" (else BERTFORGE_MALLOC=default; values other than `reuse` and `default` are an error). The
    memory a process holds
    then stays at its high-water mark until it exits, which is what a training process reaches every step anyway.
    """
    global _applied
    choice = (choice or os.environ.get("BERTFORGE_MALLOC", "reuse")).lower()  # the argument, else the environment
    if choice not in ("reuse", "default"):
        raise BertforgeError(f"BERTFORGE_MALLOC must be 'reuse' (the default) or 'default' (glibc's own), got {choice!r}")
    if _applied:
        return True
    if sys.platform != "linux" or choice == "default":
        return False
    if "LD_PRELOAD" in os.environ or any(k.startswith("MALLOC_") for k in os.environ):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl, or no C library by that name
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(_M_MMAP_MAX, 0) != 1:
        return False
    mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
    _applied = True
    log.debug("glibc malloc: large blocks from the heap, freed memory kept for reuse")
    return True


def available_cpus() -> int:
    """CPUs this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def configure_threads(num_threads: int | None) -> None:
    """Use `num_threads` intra-op threads; by default no more than the CPUs this process may use.

    PyTorch's default (one thread per physical core) is right for a dedicated machine; inside a container limited
    to fewer CPUs than the host has, it oversubscribes, which OpenMP punishes badly.
    """
    if num_threads is not None:
        if num_threads < 1:
            raise BertforgeError(f"num_threads must be at least 1, got {num_threads}")
        torch.set_num_threads(num_threads)
    elif "OMP_NUM_THREADS" not in os.environ and torch.get_num_threads() > available_cpus():
        torch.set_num_threads(available_cpus())


DEVICES = "cpu, cuda, cuda:N, mps or auto (a GPU if there is one)"  # what every --device takes (`device_name`)
INFERENCE_DEVICES = "cpu (the default), cuda, cuda:N, mps or auto (a GPU if there is one)"
#: The help of every trainer's --device (`setup_runtime` reads it; under torchrun, cuda is each process's local GPU)
TRAINING_DEVICES = "cpu, cuda, cuda:N (default: cuda when there is a GPU, else cpu)"


def device_name(device: str | None, default: str) -> str:
    """The one vocabulary of --device, for every command: "cpu", "cuda", "cuda:N", "mps" or "auto", in any case and
    spacing (None: `default`); anything else is refused in one line naming them."""
    name = (device or default).strip().lower()
    if name in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d+", name):
        return name
    raise BertforgeError(f"unknown device {device!r}; choose {DEVICES}")


def _available(name: str) -> None:
    """Refuse, in one line, a device `device_name` accepts that this machine lacks."""
    if name == "mps" and not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
        raise BertforgeError("device mps was asked for, but this machine has no Apple GPU (MPS) for PyTorch")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BertforgeError(f"device {name} was asked for, but no CUDA device is available")
        index = torch.device(name).index
        if index is not None and index >= torch.cuda.device_count():
            raise BertforgeError(f"device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def inference_device(device: str | None) -> torch.device:
    """The device inference runs on: "cpu" (None: the default), "cuda", "cuda:N", "mps", or "auto" (CUDA, else MPS,
    else CPU); one this machine lacks is refused in one line."""
    name = device_name(device, "cpu")
    if name == "auto":
        mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
        name = "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
    _available(name)
    return torch.device(name)


SKIP_MEMORY_CHECK = "BERTFORGE_SKIP_MEMORY_CHECK"  # "1": do not refuse a run the memory estimate says cannot fit


@dataclass(frozen=True)
class Switches:
    """The process-wide switches the environment sets (None: not set, the module keeps its own choice)."""

    linear: str | None = None  # BERTFORGE_LINEAR: the dense-layer kernels (`linear.set_linear_backend`)
    int8_kernel: str | None = None  # BERTFORGE_INT8_KERNEL: the int8 kernel (`linear.set_int8_kernel`)
    skip_memory_check: bool = False  # BERTFORGE_SKIP_MEMORY_CHECK=1 (`memory.check_fits` asks `memory_check_skipped`)


_skip_memory_check = False


def read_switches(environ: Mapping[str, str] = os.environ) -> Switches:
    """The switches `environ` sets, as given (`apply_switches` checks them)."""
    return Switches(linear=environ.get("BERTFORGE_LINEAR"), int8_kernel=environ.get("BERTFORGE_INT8_KERNEL"),
                    skip_memory_check=environ.get(SKIP_MEMORY_CHECK) == "1")


def apply_switches(switches: Switches) -> None:
    """Hand each switch to the module it steers; a value that names no choice is a BertforgeError naming the
    variable, before anything runs."""
    global _skip_memory_check
    from .linear import BACKENDS, INT8_KERNELS, onednn_available, set_int8_kernel, set_linear_backend

    if switches.linear is not None:
        if switches.linear not in BACKENDS:
            raise BertforgeError(f"BERTFORGE_LINEAR must be one of {', '.join(BACKENDS)}, got {switches.linear!r}")
        if switches.linear == "onednn" and not onednn_available():
            raise BertforgeError("BERTFORGE_LINEAR=onednn, but this PyTorch has no oneDNN linear kernels (mkldnn)")
        set_linear_backend(switches.linear)
    if switches.int8_kernel is not None:
        if switches.int8_kernel not in INT8_KERNELS:
            raise BertforgeError(f"BERTFORGE_INT8_KERNEL must be one of {', '.join(INT8_KERNELS)}, got "
                                 f"{switches.int8_kernel!r}")
        set_int8_kernel(switches.int8_kernel)
    _skip_memory_check = switches.skip_memory_check


def memory_check_skipped() -> bool:
    """Whether BERTFORGE_SKIP_MEMORY_CHECK=1 was set when the switches were last applied (False before)."""
    return _skip_memory_check


@dataclass
class Runtime:
    """Where this process runs: its rank among `world_size` processes (torchrun's environment) and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_process_group: bool = False  # set up here (not by the caller): torn down here at the end of the run

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def setup_runtime(device: str | None = "auto", *, threads: int | None = None, linear: str | None = None,
                  malloc: str | None = None, training: bool = True, distributed: bool = True) -> Runtime:
    """Every process-wide setting a command needs, in one place, before it writes anything.

    `device`: "auto" (CUDA when there is a GPU), "cpu", "cuda" (this process's local GPU under torchrun) or
    "cuda:N". `threads`: intra-op threads on CPU (default: one per CPU this process may use, or OMP_NUM_THREADS).
    `linear`: the dense-layer kernels, "auto", "onednn" or "aten" (`bertforge.core.linear`; default BERTFORGE_LINEAR,
    else the current choice, auto unless set); the environment's other switches are applied too (`apply_switches`).
    `training` on CPU keeps freed memory for reuse unless `malloc` is "default" (`reuse_freed_memory`; default
    BERTFORGE_MALLOC). `distributed`: join torchrun's process group (gloo on CPU, NCCL on GPU) when WORLD_SIZE > 1.
    Environment variables are only the defaults of these arguments; a misspelt one fails here. TF32 matrix
    multiplies are allowed on CUDA. The runtime made is also `last_runtime()`."""
    global _last_runtime
    from .linear import set_linear_backend

    switches = read_switches()
    if linear is not None:
        try:
            set_linear_backend(linear)
        except ValueError as err:
            raise BertforgeError(str(err)) from None
        switches = replace(switches, linear=None)  # the argument over the environment
    apply_switches(switches)
    world = int(os.environ.get("WORLD_SIZE", "1")) if distributed else 1
    rank = int(os.environ.get("RANK", "0")) if distributed else 0
    local = int(os.environ.get("LOCAL_RANK", "0")) if distributed else 0
    device = device_name(device, "auto")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "mps" and training:
        raise BertforgeError("device mps: bertforge trains on cpu or cuda (mps runs inference only: predict, embed, "
                             "evaluate, serve)")
    _available(device)
    if device.startswith("cuda"):
        dev = torch.device("cuda", local) if device == "cuda" else torch.device(device)
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif device == "cpu":
        dev = torch.device("cpu")
        configure_threads(threads)
        if training:
            reuse_freed_memory(malloc)  # no page faults on every step's large tensors
    else:  # mps, for inference
        dev = torch.device(device)
    owns = world > 1 and not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    _last_runtime = Runtime(rank, world, local, dev, owns)
    return _last_runtime


_last_runtime: Runtime | None = None


def last_runtime() -> Runtime | None:
    """The runtime the latest `setup_runtime` call of this process made (None before one): who this process is, for
    a caller that did not make it (a command after its library call)."""
    return _last_runtime


def teardown_runtime(rt: Runtime) -> None:
    """Destroy the process group `setup_runtime` created. Left to interpreter exit, gloo's threads sometimes end the
    process with `terminate called without an active exception` (SIGABRT) after a run that succeeded."""
    if rt.owns_process_group and dist.is_initialized():
        dist.destroy_process_group()


def barrier(rt: Runtime) -> None:
    if rt.distributed:
        dist.barrier()


def all_ranks_agree(rt: Runtime, ok: bool) -> bool:
    """True when `ok` holds on every rank (one all-reduce when distributed)."""
    if not rt.distributed:
        return ok
    flag = torch.tensor(0.0 if ok else 1.0, device=rt.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return not flag.item()


def on_main(rt: Runtime, check: Callable[[], None]) -> None:
    """Run `check()` on rank 0; a BertforgeError there is raised on every rank (rank 0's message on rank 0)."""
    error: BertforgeError | None = None
    if rt.is_main:
        try:
            check()
        except BertforgeError as err:
            error = err
    if not all_ranks_agree(rt, error is None):
        raise error if error is not None else BertforgeError("rank 0 refused the run")


def on_every_rank(rt: Runtime, make: Callable[[], T], elsewhere: str = "another rank refused the run") -> T:
    """`make()` on every rank; a BertforgeError on any rank is raised on every rank (its own message where it was
    raised, `elsewhere` on the others), so that no rank goes on into a collective the others never reach."""
    error: BertforgeError | None = None
    try:
        value = make()
    except BertforgeError as err:
        error = err
    if not all_ranks_agree(rt, error is None):
        raise error if error is not None else BertforgeError(elsewhere)
    return value


def from_main(rt: Runtime, compute: Callable[[], T]) -> T:
    """`compute()` on rank 0 alone, its value handed to every rank (one broadcast); an error there is raised on
    every rank (rank 0's own exception on rank 0, its message as a BertforgeError elsewhere)."""
    if not rt.distributed:
        return compute()
    box: list[Any] = [None]
    failure: BaseException | None = None
    if rt.is_main:
        try:
            box = [("ok", compute())]
        except Exception as err:  # the other ranks wait in the broadcast: they must learn of it
            failure, box = err, [("error", f"rank 0 failed: {type(err).__name__}: {err}")]
    dist.broadcast_object_list(box, src=0, device=rt.device if rt.device.type == "cuda" else None)
    kind, value = box[0]
    if failure is not None:
        raise failure
    if kind == "error":
        raise BertforgeError(str(value))
    return value
