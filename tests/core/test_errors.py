"""`bertforge.core.errors`: `BertforgeError`, the one exception for bad input, files and settings, which the command line
prints as one line (no traceback) with exit status 2."""

from __future__ import annotations

import pytest

import bertforge
from bertforge.cli import main
from bertforge.core.errors import BertforgeError


def test_bertforge_error_is_the_packages_exception():
    assert bertforge.BertforgeError is BertforgeError and issubclass(BertforgeError, Exception)
    with pytest.raises(BertforgeError, match=r"^corpus\.txt:3: not a text line$"):
        raise BertforgeError("corpus.txt:3: not a text line")


def test_the_command_line_prints_it_as_one_line_and_exits_2(monkeypatch, capsys):
    from bertforge.commands import fill_mask

    def refuse(args):
        raise BertforgeError(f"{args.model}: no such model directory")

    monkeypatch.setattr(fill_mask, "run", refuse)  # the parser is built, with each command's run, by main()
    assert main(["fill-mask", "--model", "nowhere", "a [MASK]"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "bertforge fill-mask: error: nowhere: no such model directory\n" and not captured.out
