"""Process-wide settings, in one place: intra-op threads (`configure_threads`) and, for training on CPU, the
allocator (`reuse_freed_memory`). The linear-layer kernels are chosen in `bertforge.linear`.

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
import sys

import torch

from .errors import BertforgeError

log = logging.getLogger("bertforge")

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_MAX = -4
_applied = False


def reuse_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse (no `mmap` per large tensor, no trimming below 2 GiB).

    Returns whether the setting is in force. Does nothing where it does not apply or the user has chosen: not
    Linux, no glibc, `LD_PRELOAD` (another allocator), any `MALLOC_*` tunable in the environment, or
    BERTFORGE_MALLOC=default (values other than `reuse` and `default` are an error). The memory a process holds
    then stays at its high-water mark until it exits, which is what a training process reaches every step anyway.
    """
    global _applied
    choice = os.environ.get("BERTFORGE_MALLOC", "reuse").lower()
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
