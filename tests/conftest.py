"""Fixtures shared by the tests of every directory (plain helpers are in `tests/helpers.py`)."""

from __future__ import annotations

import os

import pytest

# `--precision auto` trains in bf16 on a CPU with bf16 units: the suite takes every CPU to have none, so that its
# runs (and the processes they start) compute alike on any machine; the choice itself is tested with the
# detection faked (tests/training/test_step_mixed_precision.py).
os.environ["BERTFORGE_CPU_BF16"] = "0"

from tests.helpers import make_run_inputs


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for the module (`pytestmark = pytest.mark.usefixtures("one_thread")`): a tiny model's
    run is faster on one thread than on two busy cores, and runs compared bitwise share one GEMM blocking."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus_and_tokenizer(tmp_path_factory):
    """(corpus.txt, tokenizer dir, config.json) of a tiny pretraining run (`helpers.make_run_inputs`)."""
    return make_run_inputs(tmp_path_factory.mktemp("pretrain"))


# ---------------------------------------------------------------------------------- processes the tests start
def pytest_configure(config):
    """The test process reaps what its children leave (torchrun's workers), and SIGTERM interrupts it as Ctrl-C
    does, so that `pytest_sessionfinish` ends them either way."""
    import os
    import signal

    from tests.helpers import become_subreaper

    become_subreaper()
    main = os.getpid()

    def interrupt(signum, frame):
        if os.getpid() != main:  # a forked child inherited the handler: it ends as SIGTERM would end it
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise KeyboardInterrupt(f"signal {signum}")

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, interrupt)


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down (their servers end their own way)
def pytest_sessionfinish(session, exitstatus):
    """End every process still running below this one (`helpers.end_descendants`): an interrupted or timed-out
    run's torchrun workers, a server a failing test left."""
    from tests.helpers import end_descendants

    left = end_descendants()
    if left and exitstatus == 0:
        print(f"\nended {len(left)} process(es) the tests left running: {left}")
