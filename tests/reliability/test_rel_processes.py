"""A test run that starts processes ends them when it is interrupted (issue 46: an interrupted run left torchrun's
workers behind). A child pytest runs a test that starts a launcher, which starts a worker and is then killed (as a
timeout kills torchrun: its worker is orphaned); the run is then interrupted by Ctrl-C, or by SIGTERM. Afterwards
the worker is gone (`tests/conftest.py`: the test process reaps its orphans and ends what is left at the end)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

LEAVES_A_WORKER = '''
import os, signal, subprocess, sys, time
from pathlib import Path

def test_a_launcher_killed_leaves_its_worker(tmp_path):
    pid_file = Path(os.environ["WORKER_PID_FILE"])
    code = ("import subprocess, sys, time; from pathlib import Path; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
            "Path(sys.argv[1]).write_text(str(p.pid)); time.sleep(300)")
    launcher = subprocess.Popen([sys.executable, "-c", code, str(pid_file)])
    while not pid_file.exists() or not pid_file.read_text():
        time.sleep(0.05)
    launcher.kill()  # as a timeout kills torchrun: its worker lives on
    launcher.wait()
    if os.environ["INTERRUPT"] == "ctrl-c":
        os.kill(os.getpid(), signal.SIGINT)
    Path(os.environ["READY_FILE"]).write_text("1")
    time.sleep(300)  # interrupted here by SIGTERM from outside
'''


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
@pytest.mark.parametrize("interrupt", ["ctrl-c", "sigterm"])
def test_an_interrupted_test_run_ends_the_processes_it_started(tmp_path, interrupt):
    (tmp_path / "test_tree.py").write_text(LEAVES_A_WORKER)
    pid_file, ready = tmp_path / "worker.pid", tmp_path / "ready"
    env = {**os.environ, "WORKER_PID_FILE": str(pid_file), "READY_FILE": str(ready), "INTERRUPT": interrupt,
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q",
                            str(tmp_path / "test_tree.py")], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not (interrupt == "sigterm" and ready.exists()) and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if interrupt == "sigterm":
            run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=60)
        worker = int(pid_file.read_text())
        for _ in range(100):  # SIGTERM, then the end of the session's hook
            if not running(worker):
                break
            time.sleep(0.05)
        assert not running(worker), output
        assert "KeyboardInterrupt" in output or "Interrupted" in output or "!!!" in output, output
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if worker is not None and running(worker):
            os.kill(worker, signal.SIGKILL)
