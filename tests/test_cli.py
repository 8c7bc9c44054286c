"""`bertforge.cli`: the `bertforge` command line itself (its own options; the commands' are in tests/commands/)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.core.errors import BertforgeError

ROOT = Path(__file__).resolve().parents[1]


def test_version_prints_the_package_version(capsys):
    import importlib.metadata

    version = importlib.metadata.version("bertforge")  # the installed package's (one source: tests/test_packaging.py)
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"bertforge {version}"


def test_a_missing_command_module_fails_loudly(monkeypatch, capsys):
    """Every name in COMMANDS must be built: a missing module is a bug, reported, never skipped."""
    import bertforge.cli as cli

    monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, "no_such_command"])
    with pytest.raises(ModuleNotFoundError, match="no_such_command"):
        cli.build_parser()
    assert main(["pretrain", "--help"]) == 1
    err = capsys.readouterr().err
    assert "internal error: ModuleNotFoundError" in err and "no_such_command" in err


# ------------------------------------------------------------------------------------------- one vocabulary of options

def _subcommands() -> dict:
    from bertforge.cli import build_parser, subcommands

    return subcommands(build_parser())


def _flags(parser) -> dict[str, set[str]]:
    """dest -> the option strings that set it, for every option of `parser` but --help and --debug."""
    found: dict[str, set[str]] = {}
    for action in parser._actions:
        if action.option_strings and action.dest not in ("help", "debug"):
            found.setdefault(action.dest, set()).update(action.option_strings)
    return found


# The spellings removed when the commands took one vocabulary (docs/changelog.md lists each with its successor).
REMOVED = {"--seq-len": "--max-length", "--output": "--out", "--text-field": "--text-column",
           "--text-key": "--text-column", "--keep-last": "--keep-checkpoints", "--early-stop": "--early-stop-patience",
           "--batch-tokens": "--max-batch-tokens", "--config FILE": "--run-config", "--data": "--input",
           "--head CLASS": "--model-class", "--model KIND": "--algorithm", "--host": "--hostname",
           "--model-name": "--served-model-name", "--max-queue": "--max-concurrent-requests",
           "--max-body-bytes": "--payload-limit"}


def test_every_command_names_the_same_thing_the_same_way():
    """A setting a command shares with others (same `dest`) has the same option string in every command, and no
    command offers a removed spelling; the changelog names each removed spelling beside its successor."""
    spellings: dict[str, dict[str, set[str]]] = {}
    for name, parser in _subcommands().items():
        for dest, strings in _flags(parser).items():
            spellings.setdefault(dest, {})[name] = strings
            removed = {s for s in strings if s in REMOVED}
            assert not removed, f"{name} still offers {removed}"
    for dest, by_command in spellings.items():
        # one name, as a switch or its --no- form; serve also takes TEI's --model-id beside bertforge's --model
        names = {s[2:].removeprefix("no-") for strings in by_command.values() for s in strings if s.startswith("--")}
        assert len(names - ({"model-id"} if dest == "model" else set())) == 1, f"{dest} is spelt differently: {by_command}"
    changelog = (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8")
    for old, new in REMOVED.items():
        assert f"`{old}`" in changelog and f"`{new}`" in changelog, f"the changelog does not name {old} -> {new}"


def test_the_same_concept_has_one_name():
    """The concepts the commands shared under different names now have one: the old names are nowhere."""
    every = set().union(*(set().union(*_flags(p).values()) for p in _subcommands().values()))
    for old in ("--seq-len", "--output", "--text-field", "--text-key", "--keep-last", "--early-stop", "--batch-tokens",
                "--host", "--model-name", "--max-queue", "--max-body-bytes"):
        assert old not in every
    commands = _subcommands()
    assert "--config" not in set().union(*_flags(commands["finetune"]).values())  # --run-config: a saved run
    assert _flags(commands["export-onnx"])["model_class"] == {"--model-class"}  # --head: an attention head only
    assert _flags(commands["train-tokenizer"])["algorithm"] == {"--algorithm"}  # --model: a model directory only


def test_a_removed_spelling_is_refused_not_read_as_an_abbreviation(capsys):
    """argparse would take `--early-stop 2` as an abbreviation of `--early-stop-patience`: bertforge takes options as
    spelt only, so a removed name is refused in one line."""
    for argv in (["finetune", "--early-stop", "2"], ["pretrain", "--keep", "2"], ["embed", "--model", "m", "--input", "i.txt", "--out", "o.npy", "--max-batch", "8"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "unrecognized arguments" in err and err.count("\n") == 1, (argv, err)


def test_every_trainer_has_one_seed_default_and_replays_a_run_config():
    from bertforge.core.constants import SEED

    trainers = ("pretrain", "distill", "finetune", "glue", "train-embeddings")
    commands = _subcommands()
    for name in trainers:
        assert "run_config" in _flags(commands[name]), f"{name} has no --run-config"
        assert "--seed" in " ".join(_flags(commands[name]).get("seed", ())), f"{name} has no --seed"
        assert f"(default {SEED})" in commands[name].format_help(), f"{name}'s --seed default is not {SEED}"


def test_every_command_help_shows_examples_that_parse(capsys):
    """`bertforge COMMAND --help` ends with usage examples, and each example is a command line its parser
    accepts (an example with a renamed or missing option fails here)."""
    import shlex

    import bertforge.cli as cli

    for name, parser in _subcommands().items():
        module = __import__(f"bertforge.commands.{name.replace('-', '_')}", fromlist=["EXAMPLES"])
        assert module.EXAMPLES, f"{name} has no example"
        text = parser.format_help()
        assert "examples:" in text
        for example in module.EXAMPLES:
            assert example in text
            words = shlex.split(example, comments=True)
            assert words[:2] == ["bertforge", name], example
            parsed = cli.build_parser().parse_args(words[1:])  # argparse exits 2 on a bad option
            assert parsed.command == name


# ------------------------------------------------------------------------------------------- --quiet and --log-file

def talking(record: dict):
    """A command's `run` that logs a line at each level (and records the settings it was handed)."""
    def run(args) -> int:
        record["progress"] = getattr(args, "progress", "unset")
        log = logging.getLogger("bertforge")
        log.info("an info line")
        log.warning("a warning line")
        if record.get("fail"):
            raise BertforgeError("the corpus is empty")
        return 0
    return run


@pytest.fixture
def bare_logging(monkeypatch):
    """`main` runs with the root logger of a fresh `bertforge` process: no handlers (pytest's own, which it adds
    when the test is called, set aside for the call)."""
    import bertforge.cli as cli

    def bare_main(argv: list[str]) -> int:
        root = logging.getLogger()
        saved, root.handlers, cli._console = root.handlers, [], None
        try:
            return main(argv)
        finally:
            root.handlers, cli._console = saved, None

    return bare_main


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_keeps_warnings_and_errors_on_stderr_and_turns_progress_bars_off(monkeypatch, capsys, bare_logging, where):
    record: dict = {}
    monkeypatch.setattr("bertforge.commands.embed.run", talking(record))
    argv = ["--quiet", "embed"] if where == "before" else ["embed", "--quiet"]
    assert bare_logging([*argv, "--model", "m", "--input", "t.txt", "--out", "v.npy"]) == 0
    err = capsys.readouterr().err
    assert "a warning line" in err and "an info line" not in err
    assert record["progress"] is False


def test_without_quiet_info_lines_reach_stderr_and_progress_is_the_commands_default(monkeypatch, capsys, bare_logging):
    record: dict = {}
    monkeypatch.setattr("bertforge.commands.embed.run", talking(record))
    assert bare_logging(["embed", "--model", "m", "--input", "t.txt", "--out", "v.npy"]) == 0
    err = capsys.readouterr().err
    assert "an info line" in err and "a warning line" in err and record["progress"] is None


def test_log_file_gets_every_line_timestamped_and_the_closing_error(monkeypatch, capsys, bare_logging, tmp_path):
    log_file = tmp_path / "run.log"
    log_file.write_text("an earlier run\n")
    record = {"fail": True}
    monkeypatch.setattr("bertforge.commands.train_tokenizer.run", talking(record))
    assert bare_logging(["train-tokenizer", "--quiet", "--log-file", str(log_file), "--corpus", "c.txt", "--out", "t"]) == 2
    err = capsys.readouterr().err
    assert "an info line" not in err and err.endswith("bertforge train-tokenizer: error: the corpus is empty\n")
    lines = log_file.read_text().splitlines()
    assert lines[0] == "an earlier run"  # appended
    assert [line.split(" ", 2)[2] for line in lines[1:]] == [
        "INFO an info line", "WARNING a warning line", "ERROR bertforge train-tokenizer: error: the corpus is empty"]
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", line) for line in lines[1:])
    assert not logging.getLogger().handlers or all(  # the file is closed and let go after the command
        getattr(h, "baseFilename", None) != str(log_file) for h in logging.getLogger().handlers)


def test_log_file_dash_is_stdout(monkeypatch, capsys, bare_logging):
    monkeypatch.setattr("bertforge.commands.train_tokenizer.run", talking({}))
    assert bare_logging(["--log-file", "-", "train-tokenizer", "--corpus", "c.txt", "--out", "t"]) == 0
    out = capsys.readouterr().out
    assert "INFO an info line" in out and "WARNING a warning line" in out


def test_an_unwritable_log_file_is_refused_in_one_line(monkeypatch, capsys, bare_logging, tmp_path):
    monkeypatch.setattr("bertforge.commands.train_tokenizer.run", talking({}))
    assert bare_logging(["train-tokenizer", "--log-file", str(tmp_path / "no" / "such" / "dir.log"), "--corpus", "c.txt",
                 "--out", "t"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertforge train-tokenizer: error: --log-file ") and "No such file or directory" in err


def test_a_stopped_training_loop_exits_with_its_signals_status(monkeypatch, capsys, bare_logging):
    import signal

    from bertforge.training.loop import Interrupted

    def stopped(args):
        raise Interrupted(signal.SIGTERM, 41)

    monkeypatch.setattr("bertforge.commands.train_tokenizer.run", stopped)
    assert bare_logging(["train-tokenizer", "--corpus", "c.txt", "--out", "t"]) == 143
    assert capsys.readouterr().err == "bertforge train-tokenizer: interrupted (SIGTERM) at step 41\n"
