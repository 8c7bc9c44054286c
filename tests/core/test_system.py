"""`bertforge.core.system`: `reuse_freed_memory` (with it, a training step in steady state takes (almost) no page faults),
`setup_runtime`'s settings and the environment's switches it reads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="a glibc setting")

PROBE = r"""
import resource, sys, torch
from bertforge import BertConfig, BertForPreTraining
from bertforge.core.system import reuse_freed_memory
on = reuse_freed_memory() if sys.argv[1] == "on" else False
torch.manual_seed(0)
model = BertForPreTraining(BertConfig(vocab_size=30522, hidden_size=128, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=256))
ids = torch.randint(5, 30522, (8, 64))
def step():  # the word-embedding gradient alone is 15.6 MB, allocated afresh every step
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(input_ids=ids, labels=ids, next_sentence_label=torch.zeros(8, dtype=torch.long)).loss.backward()
    model.zero_grad(set_to_none=True)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults = [step() for _ in range(4)]
print(on, min(faults[2:]))
"""


def probe(mode: str, **env: str) -> tuple[bool, int]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env={**environ, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0] == "True", int(out[1])


def test_training_steps_reuse_freed_memory_without_page_faults():
    on, faults_on = probe("on")
    if not on:
        pytest.skip("glibc's mallopt is not available here")
    _, faults_off = probe("off")
    assert faults_off > 5_000  # pages of 4 KiB: glibc mmaps every large block afresh
    assert faults_on < faults_off / 20


def test_the_user_can_opt_out():
    assert probe("on", BERTFORGE_MALLOC="default")[0] is False
    assert probe("on", MALLOC_ARENA_MAX="2")[0] is False  # the user tunes glibc's malloc: leave it alone


def test_a_misspelt_setting_is_an_error_that_names_it(monkeypatch):
    from bertforge.core.errors import BertforgeError
    from bertforge.core.system import reuse_freed_memory

    monkeypatch.setenv("BERTFORGE_MALLOC", "off")
    with pytest.raises(BertforgeError, match="BERTFORGE_MALLOC .*'off'"):
        reuse_freed_memory()


def test_setup_runtime_takes_explicit_settings_over_the_environment(monkeypatch):
    """The kernels and the allocator are arguments of the one runtime set-up; the environment only gives defaults."""
    from bertforge.core.errors import BertforgeError
    from bertforge.core.linear import get_linear_backend, set_linear_backend
    from bertforge.core.system import setup_runtime

    before = get_linear_backend()
    monkeypatch.setenv("BERTFORGE_LINEAR", "auto")
    try:
        rt = setup_runtime("cpu", linear="aten", training=False, distributed=False)
        assert rt.device.type == "cpu" and rt.world_size == 1 and get_linear_backend() == "aten"
        with pytest.raises(BertforgeError, match="linear backend must be one of"):
            setup_runtime("cpu", linear="fast", training=False, distributed=False)
    finally:
        set_linear_backend(before)
    with pytest.raises(BertforgeError, match="unknown device 'tpu'"):
        setup_runtime("tpu", distributed=False)


def test_the_allocator_setting_is_an_argument_too():
    """`setup_runtime(malloc="default")` leaves glibc alone even where BERTFORGE_MALLOC asks for reuse."""
    code = ("from bertforge.core.system import setup_runtime, reuse_freed_memory; import bertforge.core.system as s; "
            "setup_runtime('cpu', malloc='default', distributed=False); print(s._applied)")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", code], env={**environ, "BERTFORGE_MALLOC": "reuse"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False"]
    code_on = code.replace("malloc='default', ", "")
    out = subprocess.run([sys.executable, "-c", code_on], env={**environ, "BERTFORGE_MALLOC": "reuse"},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True"]


def test_a_misspelt_environment_backend_is_an_error_that_names_it(monkeypatch):
    """BERTFORGE_LINEAR is read and checked by the runtime set-up, before anything runs."""
    from bertforge.core.errors import BertforgeError
    from bertforge.core.linear import get_linear_backend
    from bertforge.core.system import setup_runtime

    before = get_linear_backend()
    monkeypatch.setenv("BERTFORGE_LINEAR", "onednnn")
    with pytest.raises(BertforgeError, match="BERTFORGE_LINEAR .*'onednnn'"):
        setup_runtime("cpu", training=False, distributed=False)
    assert get_linear_backend() == before


def test_switches_are_read_by_setup_runtime_not_at_import():
    """A library user who never sets up a runtime has the defaults; `setup_runtime` applies the environment's
    switches (the kernels, the memory check) and remembers the runtime it made."""
    code = ("import bertforge.core.linear as l, bertforge.core.system as s; a = (l.get_linear_backend(), l._int8_choice, "
            "s.memory_check_skipped(), s.last_runtime()); rt = s.setup_runtime('cpu', training=False, "
            "distributed=False); print(*a, l.get_linear_backend(), l._int8_choice, s.memory_check_skipped(), "
            "s.last_runtime() is rt, rt.is_main)")
    env = {**os.environ, "BERTFORGE_LINEAR": "aten", "BERTFORGE_INT8_KERNEL": "fbgemm",
           "BERTFORGE_SKIP_MEMORY_CHECK": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["auto", "onednn", "False", "None", "aten", "fbgemm", "True", "True", "True"]


def test_read_switches_takes_them_as_given():
    from bertforge.core.system import Switches, read_switches

    assert read_switches({}) == Switches()
    assert read_switches({"BERTFORGE_LINEAR": "aten", "BERTFORGE_SKIP_MEMORY_CHECK": "yes"}) == Switches("aten")
    assert read_switches({"BERTFORGE_SKIP_MEMORY_CHECK": "1"}).skip_memory_check


def test_one_process_runs_on_main_and_on_every_rank_checks_as_they_are():
    """Without torchrun: `from_main` and `on_every_rank` return the value computed here and raise its error as
    it is (the two-process behaviour: tests/finetune/test_api_distributed.py)."""
    from bertforge.core.errors import BertforgeError
    from bertforge.core.system import Runtime, from_main, on_every_rank

    rt = Runtime(0, 1, 0, __import__("torch").device("cpu"))
    assert from_main(rt, lambda: {"accuracy": 0.5}) == {"accuracy": 0.5}
    assert on_every_rank(rt, lambda: 3) == 3

    def refuse():
        raise BertforgeError("no")

    for call in (from_main, on_every_rank):
        with pytest.raises(BertforgeError, match="^no$"):
            call(rt, refuse)


def test_every_command_takes_one_device_vocabulary():
    """Issue 46: inference took `mps` and any case, training refused `mps` as unknown and took `cuda:-1` (torch then
    failed). Now one definition (`device_name`) reads every --device: the same names, the same refusals."""
    import torch

    from bertforge.core.errors import BertforgeError
    from bertforge.core.system import device_name, inference_device, setup_runtime

    def training(name):
        return setup_runtime(name, training=False, distributed=False).device

    for read in (inference_device, training):
        assert read(" CPU ") == torch.device("cpu")
        for bad in ("cuda:-1", "gpu", "cuda:x", "cuda:"):
            with pytest.raises(BertforgeError, match=f"unknown device '{bad}'; choose cpu, cuda, cuda:N, mps or auto"):
                read(bad)
        if not torch.cuda.is_available():
            with pytest.raises(BertforgeError, match="device cuda:1 was asked for, but no CUDA device is available"):
                read("cuda:1")
    assert device_name("Cuda:0", "cpu") == "cuda:0" and device_name(None, "auto") == "auto"
    with pytest.raises(BertforgeError, match="device mps: bertforge trains on cpu or cuda"):
        setup_runtime("mps", distributed=False)
    if not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
        for read in (inference_device, training):  # evaluate and predict take mps as the pipelines do
            with pytest.raises(BertforgeError, match="device mps was asked for, but this machine has no Apple GPU"):
                read("mps")
