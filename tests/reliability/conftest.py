"""Reliability figures (kills survived, corrupt files tried, ...) are printed by each test and repeated at the end
of the session, so they show without `pytest -s` too."""

from __future__ import annotations

from tests.reliability import rel_helpers


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if rel_helpers.FIGURES:
        terminalreporter.section("reliability figures")
        for line in rel_helpers.FIGURES:
            terminalreporter.write_line(line)
