"""`bertforge.core.io`: an atomic write leaves the old file or the new one, never a part; JSONL objects and text files
are checked; every failure is a `BertforgeError` naming the file."""

from __future__ import annotations

import json
import re

import pytest

from bertforge.core.errors import BertforgeError
from bertforge.core.io import atomic_write, atomic_write_text, binary_reason, check_text, json_object


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
