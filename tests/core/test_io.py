"""`bertforge.core.io`: an atomic write leaves the old file or the new one, never a part; JSONL objects and text files
are checked; every failure is a `BertforgeError` naming the file."""

from __future__ import annotations

import json
import os
import re

import pytest

from bertforge.core.errors import BertforgeError
from bertforge.core.io import atomic_write, atomic_write_bytes, atomic_write_text, binary_reason, check_text, json_object


def test_an_atomic_write_replaces_the_target_or_leaves_it_as_it_was(tmp_path):
    target = tmp_path / "sub" / "notes.txt"
    atomic_write_text(target, "first\n")  # the directory is made
    atomic_write_text(target, "second\n")
    assert target.read_text() == "second\n"

    def full_disk(tmp):
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(BertforgeError, match=re.escape(f"cannot write {target}: No space left on device")):
        atomic_write(target, full_disk)
    assert target.read_text() == "second\n"
    assert [p.name for p in target.parent.iterdir()] == ["notes.txt"]  # no temporary file left behind


def test_json_object_names_the_line():
    assert json_object('{"text": "a"}', "f.jsonl:1") == {"text": "a"}
    with pytest.raises(BertforgeError, match="^f.jsonl:2: not valid JSON"):
        json_object("{text", "f.jsonl:2")
    with pytest.raises(BertforgeError, match="^f.jsonl:3: expected a JSON object, got list$"):
        json_object("[1, 2]", "f.jsonl:3")


def test_binary_files_are_told_from_text(tmp_path):
    assert binary_reason("plain text, ünïcödé\ttabs\r\n".encode()) is None
    assert binary_reason(b"text\x00more") == "a NUL byte at offset 4"
    assert "UTF-16" in binary_reason("text".encode("utf-16"))
    assert "control characters" in binary_reason(bytes(range(1, 32)) * 10)
    text, utf16 = tmp_path / "ok.txt", tmp_path / "utf16.txt"
    text.write_text("a line\n", encoding="utf-8")
    utf16.write_text("a line\n", encoding="utf-16")
    check_text(text)
    with pytest.raises(BertforgeError, match=re.escape(f"{utf16}: not a text file: UTF-16")):
        check_text(utf16)


def test_a_write_of_several_files_stopped_between_its_renames_is_finished_by_the_next_reader(tmp_path, monkeypatch):
    """Issue 46's fault injection found `save_pretrained` (model and tokenizer) killed between the renames of its
    files leaving new files beside old ones (a tokenizer.json of one save, a tokenizer_config.json of the other: 6
    of 40 kills). The renames are now recorded first (PENDING_WRITES) and the next read or write makes the rest."""
    import os

    from bertforge.core import io
    from bertforge.model.config import BertConfig
    from tests.helpers import TINY_CONFIG

    directory = tmp_path / "model"
    BertConfig(**TINY_CONFIG).save_pretrained(directory)
    (directory / "extra.txt").write_text("old")
    real, renames = os.replace, []

    def stop_after_one(source, target):  # as a SIGKILL after the first rename would
        if renames and not str(target).endswith(io.PENDING_WRITES):
            raise KeyboardInterrupt
        if not str(target).endswith(io.PENDING_WRITES):
            renames.append(target)
        real(source, target)

    monkeypatch.setattr(io.os, "replace", stop_after_one)
    new_config = json.dumps(BertConfig(**{**TINY_CONFIG, "hidden_size": 48, "num_attention_heads": 4}).to_dict())
    with pytest.raises(KeyboardInterrupt):
        io.atomic_write_files(directory, {"config.json": lambda tmp: tmp.write_text(new_config),
                                          "extra.txt": lambda tmp: tmp.write_text("new")})
    monkeypatch.setattr(io.os, "replace", real)
    assert (directory / io.PENDING_WRITES).is_file()
    assert json.loads((directory / "config.json").read_text())["hidden_size"] == 48
    assert (directory / "extra.txt").read_text() == "old"  # a mix of two writes, as the kill left it
    assert BertConfig.from_pretrained(directory).hidden_size == 48  # the reader finishes the write
    assert (directory / "extra.txt").read_text() == "new" and not (directory / io.PENDING_WRITES).exists()
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_next_write_removes_what_a_killed_writer_of_this_host_left_and_nothing_else(tmp_path):
    from bertforge.core import io

    target = tmp_path / "model.safetensors"
    dead, host = dead_pid(), io._HOST
    stale = tmp_path / f".model.safetensors.{host}-{dead}.abc123_x.tmp"  # a writer SIGKILLed mid-save
    stale_dir = tmp_path / f".model.safetensors.{host}-{dead}.zz9.tmp"
    kept = [tmp_path / f".model.safetensors.{host}-{os.getppid()}.live01.tmp",  # a live process's
            tmp_path / f".model.safetensors.otherhost-{dead}.abc.tmp",  # another host's (a shared filesystem)
            tmp_path / f".config.json.{host}-{dead}.abc.tmp",  # another name's: its own next write removes it
            tmp_path / ".model.safetensors.oldstyle.tmp"]  # no writer named: left
    for path in [stale, *kept]:
        path.write_bytes(b"half")
    stale_dir.mkdir()
    (stale_dir / "part").write_bytes(b"x")
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert not stale.exists() and not stale_dir.exists()
    assert all(path.exists() for path in kept)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == sorted(p.name for p in kept)


def test_a_pending_write_keeps_its_temporary_files_for_the_reader_that_finishes_it(tmp_path):
    from bertforge.core import io

    dead = dead_pid()
    staged = tmp_path / f".vocab.txt.{io._HOST}-{dead}.abc.tmp"
    staged.write_text("new vocabulary")
    (tmp_path / io.PENDING_WRITES).write_text(json.dumps([[staged.name, "vocab.txt"]]))
    assert io.sweep_stale(tmp_path) == 0 and staged.exists()
    io.finish_pending_writes(tmp_path)
    assert (tmp_path / "vocab.txt").read_text() == "new vocabulary"

