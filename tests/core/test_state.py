"""`bertforge.core.state`: a training state (any nest of dicts, lists, tuples, numbers, strings, tensors and arrays) saved
as JSON + safetensors, never a pickle, and read back the same; an unreadable state is a `BertforgeError`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge.core.errors import BertforgeError
from bertforge.core.state import load_state, save_state, state_files


def test_a_nest_round_trips_with_its_types(tmp_path):
    state = {"step": 3, "lr": 1e-3, "name": "adamw", "done": False, "none": None, "scalar": np.float32(0.5),
             1: ("moments", [torch.arange(4), {"exp_avg": torch.ones(2, 3, dtype=torch.bfloat16)}]),
             "array": np.arange(5)}
    save_state(tmp_path, "trainer", state)
    json_file, tensor_file = state_files(tmp_path, "trainer")
    assert sorted(p.name for p in tmp_path.iterdir()) == [json_file.name, tensor_file.name]  # JSON + safetensors only
    back = load_state(tmp_path, "trainer")
    assert set(back) == set(state) and 1 in back  # an int key stays an int
    assert (back["step"], back["lr"], back["name"], back["done"], back["none"]) == (3, 1e-3, "adamw", False, None)
    assert back["scalar"] == 0.5 and type(back["scalar"]) is float
    assert isinstance(back[1], tuple) and back[1][0] == "moments"
    ids, moments = back[1][1]
    assert torch.equal(ids, torch.arange(4))
    assert moments["exp_avg"].dtype == torch.bfloat16
    assert torch.equal(moments["exp_avg"], torch.ones(2, 3, dtype=torch.bfloat16))
    assert isinstance(back["array"], np.ndarray) and np.array_equal(back["array"], np.arange(5))


def test_a_state_without_tensors_is_json_alone_and_damage_is_named(tmp_path):
    save_state(tmp_path, "data", [{"epoch": 1, "row_pos": 7}])
    json_file, tensor_file = state_files(tmp_path, "data")
    assert load_state(tmp_path, "data") == [{"epoch": 1, "row_pos": 7}] and not tensor_file.exists()
    with pytest.raises(BertforgeError, match="nothing.json: missing"):
        load_state(tmp_path, "nothing")
    json_file.write_text("{not json")
    with pytest.raises(BertforgeError, match="state 'data' is unreadable"):
        load_state(tmp_path, "data")
    with pytest.raises(TypeError, match="cannot store a set"):
        save_state(tmp_path, "bad", {"seen": {1, 2}})


def test_files_fingerprint_and_check_same_files(tmp_path):
    from bertforge.core.state import DataChanged, check_same_files, files_fingerprint

    a = tmp_path / "a.tsv"
    a.write_text("x\t1\n")
    then = files_fingerprint([a], digest=True)
    assert then[0][:2] == ["a.tsv", 4] and len(then[0][2]) == 32
    assert files_fingerprint([a]) == [["a.tsv", 4]]  # name and size only: a corpus is not read twice
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "a.tsv").write_text("x\t1\n")
    check_same_files(then, files_fingerprint([moved / "a.tsv"], digest=True), "data")  # where it lives is not what it is
    a.write_text("y\t0\n")  # same size, other bytes
    with pytest.raises(DataChanged, match=r"the data differs .* was a\.tsv \(4 bytes, contents \w{8}\), is a\.tsv \(4 "):
        check_same_files(then, files_fingerprint([a], digest=True), "data")
    with pytest.raises(DataChanged, match=r"1 file then, 0 now; file 1 was a\.tsv \(4 bytes\), is nothing"):
        check_same_files(then, [], "data")
