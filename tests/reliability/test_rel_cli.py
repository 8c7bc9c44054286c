"""CLI hygiene: every subcommand that `bertforge --help` lists (discovered from `bertforge.cli.build_parser()`,
so commands added later are covered without editing this file), given bad arguments or bad files, exits non-zero
with one line on stderr that names the problem - never a traceback, never an "internal error" - and `--debug`
shows the traceback.

Most cases call `bertforge.cli.main(argv)` in-process (a subprocess costs seconds of imports); two run the real
`python -m bertforge` entry point.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest

from bertforge import cli
from tests.helpers import make_run_inputs
from tests.reliability.rel_helpers import bertforge_cmd, make_model_dir, one_torch_thread, report, subprocess_env

# Options whose value is a model or tokenizer directory, an input file, or an output path, by `dest`.
MODEL_DESTS = {"model", "model_dir", "tokenizer", "checkpoint", "pretrained", "teacher"}
INPUT_DESTS = {"input", "inputs", "data", "train", "dev", "test", "corpus", "file", "text_file"}
OUTPUT_DESTS = {"out", "output", "output_dir", "save", "onnx", "out_file"}
# Trainers whose required settings may come from --run-config instead: the command names what is missing.
REQUIRED_IN_EFFECT = {"distill": ["--teacher is required"],
                      "finetune": ["missing required option(s): --task, --model, --train, --dev, --out"],
                      "glue": ["missing required option(s): --model, --data-dir"],
                      "train-embeddings": ["missing required option(s): --model, --train, --out"]}
# Keep a command that accepts its (odd) input short.
SHORT_RUN = {"max_steps": "1", "epochs": "1", "batch_size": "2", "max_length": "16", "save_every": "1", "vocab_size": "60"}


def subcommands() -> dict[str, argparse.ArgumentParser]:
    return cli.subcommands(cli.build_parser())


COMMANDS = sorted(subcommands())


def invoke(argv: list[str], capsys) -> tuple[int, str, str]:
    """`bertforge ARGV` in-process: (exit status, stdout, stderr). Any exception escaping main() fails the test,
    as the traceback it would print would."""
    try:
        rc = cli.main(argv)
    except SystemExit as exit_:
        rc = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def assert_one_line_error(command: str, rc: int, err: str, *names: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc != 0, f"exit status 0; stderr: {err!r}"
    assert "Traceback" not in err, err
    assert "internal error" not in err, f"a non-BertforgeError escaped the command (a bug): {err}"
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    assert lines[0].startswith(f"bertforge {command}: error: "), lines[0]
    for name in names:
        assert name in lines[0], f"{name!r} not named in: {lines[0]}"
    return lines[0]


def options_of(command: str) -> list[argparse.Action]:
    return [a for a in subcommands()[command]._actions if not isinstance(a, argparse._HelpAction)]


def flag(action: argparse.Action) -> str | None:
    longs = [o for o in action.option_strings if o.startswith("--")]
    return longs[0] if longs else (action.option_strings[0] if action.option_strings else None)


def takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                                                           argparse._StoreConstAction, argparse._CountAction,
                                                           argparse._VersionAction))


# ---------------------------------------------------------------------------------------------- discovery


def test_help_lists_every_discovered_subcommand(capsys):
    rc, out, _ = invoke(["--help"], capsys)
    assert rc == 0
    for command in COMMANDS:
        assert command in out
    assert {"pretrain", "train-tokenizer"} <= set(COMMANDS)
    report(f"CLI: {len(COMMANDS)} subcommands checked for one-line errors: {', '.join(COMMANDS)}")


@pytest.mark.parametrize("command", COMMANDS)
def test_subcommand_help(command, capsys):
    rc, out, err = invoke([command, "--help"], capsys)
    assert rc == 0 and f"bertforge {command}" in out and not err


@pytest.mark.parametrize("argv, names", [(["no-such-command"], ["invalid choice", "no-such-command"]),
                                         (["--no-such-flag"], ["unrecognized arguments", "--no-such-flag"])])
def test_top_level_bad_arguments(argv, names, capsys):
    rc, _, err = invoke(argv, capsys)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("bertforge: error: "), err
    assert all(name in err for name in names) and err.rstrip().endswith("(see bertforge --help)")


# ---------------------------------------------------------------------------------------------- bad arguments


def required_argv(command: str) -> list[str]:
    """The command's required arguments with placeholder values (so argparse gets as far as the unknown flag)."""
    argv = []
    for action in options_of(command):
        if action.required:
            value = str(action.choices[0] if action.choices else "1")
            option = flag(action)
            argv += [value] if option is None else [option, value] if takes_value(action) else [option]
    return argv


@pytest.mark.parametrize("command", COMMANDS)
def test_unknown_flag(command, capsys):
    rc, _, err = invoke([command, *required_argv(command), "--no-such-flag", "7"], capsys)
    line = assert_one_line_error(command, rc, err, "unrecognized arguments", "--no-such-flag")
    assert rc == 2 and line.endswith(f"(see bertforge {command} --help)")


@pytest.mark.parametrize("command", COMMANDS)
def test_missing_required_arguments(command, capsys):
    required = [argparse._get_action_name(a) for a in options_of(command) if a.required]
    if not required and command not in REQUIRED_IN_EFFECT:
        pytest.skip(f"bertforge {command} has no argument that argparse requires")
    rc, _, err = invoke([command], capsys)
    assert rc == 2
    assert_one_line_error(command, rc, err, *(REQUIRED_IN_EFFECT.get(command) or ["required", *required]))


@pytest.mark.parametrize("command", COMMANDS)
def test_values_of_the_wrong_type_or_not_a_choice(command, capsys):
    checked = 0
    for action in options_of(command):
        option = flag(action)
        if option is None or not takes_value(action):
            continue
        if action.choices is not None:
            bad, expect = "no-such-choice", "invalid choice"
        elif action.type in (int, float):
            bad, expect = "not-a-number", f"invalid {action.type.__name__} value"
        else:
            continue
        rc, _, err = invoke([command, option, bad], capsys)
        assert rc == 2
        assert_one_line_error(command, rc, err, option, expect, bad)
        checked += 1
    for action in options_of(command):  # an option given without its value (one whose value is optional aside)
        option = flag(action)
        if option and takes_value(action) and action.nargs != "?":
            rc, _, err = invoke([command, option], capsys)
            assert rc == 2
            assert_one_line_error(command, rc, err, option, "expected")
            checked += 1
    if not checked:
        pytest.skip(f"bertforge {command} has no typed or valued options")


# ---------------------------------------------------------------------------------------------- bad files


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli_files")
    corpus, tok, _ = make_run_inputs(root / "inputs")
    good = make_model_dir(root / "good_model", tokenizer_dir=tok)
    corrupt = root / "corrupt_model"
    corrupt.mkdir()
    (corrupt / "config.json").write_text('{"vocab_size": "many", ')
    (corrupt / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header")
    (corrupt / "vocab.txt").write_bytes(b"\xff\xfe[PAD]\n")
    (corrupt / "tokenizer.json").write_text("[1, 2")
    text = root / "input.txt"
    text.write_text("label,text\n1,a fine sentence\n0,another one\n")
    not_utf8 = root / "not-utf8.txt"
    not_utf8.write_bytes(b"label,text\n1,caf\xe9 \xff\xfe\n0,\x80\x81\x82 bytes\n" * 3)
    return dict(good=good, corrupt=corrupt, missing=root / "does-not-exist", text=text, not_utf8=not_utf8,
                corpus=corpus, tok=tok, root=root)


def output_suffix(action: argparse.Action) -> str:
    """An output FILE whose help names a format (".npy", "image file (.png, ...)") gets that suffix."""
    if action.metavar != "FILE":
        return ""
    found = re.search(r"\b(npy|onnx|png|pdf|svg|jpe?g|jsonl|json|csv|tsv|txt)\b", (action.help or "").lower())
    return f".{found.group(1)}" if found else ""


def argv_for(command: str, model: Path, data: Path, out_root: Path) -> list[str] | None:
    """Every required argument filled, path-like ones with `model` / `data` / fresh output paths; None when the
    command takes neither a model nor an input file."""
    argv, uses_files = [command], False
    for action in options_of(command):
        dest, option = action.dest, flag(action)
        value = None
        if dest in MODEL_DESTS:
            value, uses_files = str(model), True
        elif dest in INPUT_DESTS:
            value, uses_files = str(data), True
        elif dest in OUTPUT_DESTS:
            value = str(out_root / f"{command}-{dest}{output_suffix(action)}")
        elif dest == "data_dir":  # glue's: required in effect (--run-config may give it instead)
            value = str(out_root)
        elif dest in SHORT_RUN and option:
            value = SHORT_RUN[dest]
        elif option == "--no-progress":
            argv.append(option)
        elif action.choices and action.default is None and dest not in ("loss", "sparse"):  # e.g. --task, required in
            # effect but not for argparse (finetune's --loss is the rerank task's; --sparse a choice)
            value = str(action.choices[0])
        elif action.required:
            value = str(action.choices[0] if action.choices else 1 if action.type in (int, float) else "x")
        if value is None:
            continue
        if option is None:
            argv.append(value)
        else:
            argv += [option, value] if takes_value(action) else [option]
    return argv if uses_files else None


def model_commands() -> list[str]:
    return [c for c in COMMANDS if any(a.dest in MODEL_DESTS for a in options_of(c))]


@pytest.mark.parametrize("which", ["missing", "corrupt"])
@pytest.mark.parametrize("command", model_commands())
def test_bad_model_directory(command, which, files, tmp_path, capsys):
    """A model (or tokenizer) directory that does not exist, or holds garbage: one line naming it."""
    argv = argv_for(command, files[which], files["text"], tmp_path)
    with one_torch_thread():
        rc, _, err = invoke(argv, capsys)
    assert_one_line_error(command, rc, err, str(files[which]))


def input_commands() -> list[str]:
    return [c for c in COMMANDS if any(a.dest in INPUT_DESTS for a in options_of(c))]


@pytest.mark.parametrize("command", input_commands())
def test_non_utf8_input_file(command, files, tmp_path, capsys):
    """Either accepted (decoded with replacement, as pretraining corpora are) or refused in one line naming the file."""
    model = files["good"] if command in model_commands() else files["tok"]
    argv = argv_for(command, model, files["not_utf8"], tmp_path)
    with one_torch_thread():
        rc, _, err = invoke(argv, capsys)
    if rc != 0:
        line = assert_one_line_error(command, rc, err, "not-utf8.txt")
    else:
        assert "Traceback" not in err and "internal error" not in err
    outcome = f"refused: {line.split(': error: ', 1)[1][:110]}" if rc else "accepted (invalid bytes replaced)"
    report(f"CLI: bertforge {command} with a non-UTF-8 input file: {outcome}")


@pytest.mark.parametrize("command", model_commands())
def test_debug_shows_the_traceback(command, files, tmp_path, capsys):
    argv = argv_for(command, files["missing"], files["text"], tmp_path)
    for debug_argv in (["--debug", *argv], [*argv, "--debug"]):
        rc, _, err = invoke(debug_argv, capsys)
        assert rc != 0 and "Traceback (most recent call last)" in err, err
        assert err.strip().splitlines()[-1].startswith(f"bertforge {command}: error: ")


def test_real_entry_point_one_line(files, tmp_path):
    """`python -m bertforge` itself (one process; the in-process tests above cover --debug): logging goes to stderr
    there, so the error is the last line, and no traceback."""
    command = model_commands()[0]
    argv = argv_for(command, files["missing"], files["text"], tmp_path)
    plain = subprocess.run(bertforge_cmd(*argv), capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr, plain.stderr
    assert plain.stderr.strip().splitlines()[-1].startswith(f"bertforge {command}: error: ")
    assert str(files["missing"]) in plain.stderr


def test_pretrain_error_with_the_progress_bar_on_starts_its_own_line(files, tmp_path, capsys):
    argv = ["pretrain", "--corpus", str(files["not_utf8"]), "--tokenizer", str(files["tok"]), "--out",
            str(tmp_path / "run"), "--max-steps", "1"]  # one document: NSP needs two; the bar is already up
    with one_torch_thread():
        rc, _, err = invoke(argv, capsys)
    assert rc == 2
    screen = [segment for line in err.split("\n") for segment in line.split("\r") if segment.strip()]
    errors = [segment for segment in screen if "error:" in segment]
    assert errors and all(segment.startswith("bertforge pretrain: error: ") for segment in errors), screen
    assert screen[-1].startswith("bertforge pretrain: error: "), screen
