"""Corrupt and hostile files: every one gets a BertforgeError that names the file and the problem (or, where the
damage is undetectable, such as a flipped bit deep inside a weight, the model simply loads).

Weights (truncated, bit-flipped, lying headers, wrong shapes and dtypes), config.json (missing, wrong-typed and
absurd fields, not JSON, an array, nested 100,000 deep), tokenizer files, a pytorch_model.bin carrying code, a
shard index naming files outside the model directory, and training checkpoints whose state files are damaged.
Then a mutation fuzzer: randomly damaged checkpoints (safetensors, pytorch_model.bin or shards + index, with
or without a damaged config.json), no exception but BertforgeError: 100 in the fast suite, 2,000 with -m slow.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import random
import shutil
import struct
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge import BertConfig, BertForPreTraining, BertForSequenceClassification, BertModel, BertforgeError
from bertforge.model.checkpoint import read_state_dict
from bertforge.model import MODEL_CLASSES
from bertforge.pretrain.trainer import PretrainArgs, Pretrainer, pretrain
from bertforge.tokenizer import Tokenizer
from tests.helpers import SPECIALS, TINY_CONFIG, make_run_inputs, tiny_run_args, write_vocab
from tests.reliability.rel_helpers import make_model_dir, one_torch_thread, report, tensors_differ


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("pristine") / "model")


@pytest.fixture
def model_dir(pristine, tmp_path) -> Path:
    """A fresh copy to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "model"))


def load_error(directory: Path, cls=BertForPreTraining) -> str:
    with pytest.raises(BertforgeError) as caught:
        cls.from_pretrained(directory)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def header_of(blob: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def with_header(header: dict, body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + body


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def bertforge_warnings():
    """The warnings the "bertforge" logger gives inside the block (kept here, not printed)."""
    logger, handler = logging.getLogger("bertforge"), _Collect()
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def file_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """What the weight files of `directory` hold, read without bertforge: safetensors' and torch's own readers."""
    if (directory / "model.safetensors").is_file():
        return load_file(str(directory / "model.safetensors"))
    if (directory / "model.safetensors.index.json").is_file():
        weight_map = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            state.update(load_file(str(directory / shard)))
        return state
    return torch.load(directory / "pytorch_model.bin", weights_only=True)


def judge_load(model: torch.nn.Module, directory: Path, pristine: dict[str, torch.Tensor],
               warned: list[str]) -> tuple[str, list[str]]:
    """How a model that loaded from `directory` relates to the files, as (outcome, problems).

    Every tensor of the model must be either the file's tensor with the same name, bit for bit (outcome "same as
    saved" when that is also the undamaged checkpoint's tensor, "as the damaged file says" when the damage is one
    no loader can see, such as a flipped bit inside a weight), or named in `loading_info` as missing or mismatched
    *and* in a warning (outcome "re-initialised, reported"). Anything else, a weight re-initialised or changed
    without a word, is a problem."""
    info = model.loading_info
    reported = set(info.missing_keys) | {entry.split(" ")[0] for entry in info.mismatched_keys}
    try:
        held = file_tensors(directory)
    except Exception as err:  # bertforge loaded what the plain readers refuse
        return "loaded", [f"loaded, but the files do not read without bertforge: {type(err).__name__}: {err}"]
    own = model.state_dict()
    prefix = "" if any(k.startswith("bert.") for k in own) else "bert."  # a bare BertModel from a headed checkpoint
    problems, outcome = [], "same as saved"
    for name, tensor in own.items():
        if name in reported:
            outcome = "re-initialised, reported"
            if not any(name in message for message in warned):
                problems.append(f"{name}: in loading_info but named in no warning")
            continue
        key = prefix + name
        if key not in held:
            problems.append(f"{name}: not in the files, yet not reported as missing")
        elif tensors_differ({key: tensor}, {key: held[key].to(tensor.dtype)}):
            problems.append(f"{name}: differs from the file's {key!r} and is not reported (re-initialised?)")
        elif tensors_differ({key: tensor}, {key: pristine[key].to(tensor.dtype)}) and outcome == "same as saved":
            outcome = "as the damaged file says"
    return outcome, problems


# ---------------------------------------------------------------------------------------------- model.safetensors


@pytest.mark.parametrize("cut", ["empty", "7 bytes", "inside the header", "after the header", "half", "last byte"])
def test_truncated_weights(model_dir, cut):
    weights = model_dir / "model.safetensors"
    blob = weights.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    keep = {"empty": 0, "7 bytes": 7, "inside the header": 8 + n // 2, "after the header": 8 + n,
            "half": len(blob) // 2, "last byte": len(blob) - 1}[cut]
    weights.write_bytes(blob[:keep])
    message = load_error(model_dir)
    assert str(weights) in message and "not a readable safetensors file" in message


@pytest.mark.parametrize("seed", range(8))
def test_bit_flips_in_the_header(model_dir, pristine, seed):
    """Refused with the file named, or loaded with every weight as saved except those reported as missing (a flip
    inside a key name: that weight is "unexpected" and its model weight newly initialised, with a warning)."""
    weights = model_dir / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    n = struct.unpack("<Q", blob[:8])[0]
    rng = random.Random(seed)
    where = rng.randrange(0, 8 + n)
    blob[where] ^= 1 << rng.randrange(8)
    weights.write_bytes(bytes(blob))
    try:
        with bertforge_warnings() as warned:
            model = BertForPreTraining.from_pretrained(model_dir)
    except BertforgeError as err:
        assert str(weights) in str(err) or "config.json" in str(err), str(err)
        return
    outcome, problems = judge_load(model, model_dir, read_state_dict(pristine)[0], warned)
    assert not problems, problems
    assert outcome in ("same as saved", "re-initialised, reported"), outcome  # the body bytes were not touched


def test_bit_flips_in_the_body_load_or_are_reported(model_dir):
    """Undetectable without a checksum unless a value turns NaN or infinite: then the weight is named."""
    weights = model_dir / "model.safetensors"
    header, body = header_of(weights.read_bytes())
    body = bytearray(body)
    start = header["bert.embeddings.word_embeddings.weight"]["data_offsets"][0]
    body[start + 3] = 0x7F  # float32 little-endian: exponent all ones -> NaN or inf
    body[start + 2] |= 0x80
    weights.write_bytes(with_header(header, bytes(body)))
    message = load_error(model_dir)
    assert "NaN or infinite" in message and "word_embeddings" in message


@pytest.mark.parametrize(
    "lie",
    ["length 2**63", "length past the end", "offsets past the end", "offsets reversed", "overlapping offsets",
     "shape 2**40 x 2**40", "dtype int64 same size", "dtype unknown", "not JSON", "JSON array"],
)
def test_weights_with_a_lying_header(model_dir, lie):
    weights = model_dir / "model.safetensors"
    blob = weights.read_bytes()
    header, body = header_of(blob)
    name = "bert.embeddings.word_embeddings.weight"
    entry = header[name]
    start, end = entry["data_offsets"]
    if lie == "length 2**63":
        data = struct.pack("<Q", 2**63) + blob[8:]
    elif lie == "length past the end":
        data = struct.pack("<Q", len(blob)) + blob[8:]
    else:
        if lie == "offsets past the end":
            entry["data_offsets"] = [start, len(body) + 4096]
        elif lie == "offsets reversed":
            entry["data_offsets"] = [end, start]
        elif lie == "overlapping offsets":
            entry["data_offsets"] = [start - 4, end - 4] if start else [start + 4, end + 4]
        elif lie == "shape 2**40 x 2**40":
            entry["shape"] = [2**40, 2**40]
        elif lie == "dtype int64 same size":
            entry["dtype"], entry["shape"] = "I64", [entry["shape"][0], entry["shape"][1] // 2]
        elif lie == "dtype unknown":
            entry["dtype"] = "F128"
        data = with_header(header, body)
        if lie == "not JSON":
            data = struct.pack("<Q", 16) + b"{not json at all" + body
        elif lie == "JSON array":
            data = struct.pack("<Q", 8) + b"[1,2,3] " + body
    weights.write_bytes(data)
    started = time.perf_counter()
    message = load_error(model_dir)
    assert time.perf_counter() - started < 10  # nothing was allocated from the lie
    assert str(weights) in message, message


def test_weights_of_the_wrong_shape(model_dir):
    state = read_state_dict(model_dir)[0]
    state["bert.encoder.layer.1.attention.self.query.weight"] = torch.zeros(32, 16)
    save_file(state, str(model_dir / "model.safetensors"))
    message = load_error(model_dir)
    assert "model.safetensors" in message and "attention.self.query.weight" in message
    assert "[32, 16]" in message and "[32, 32]" in message


@pytest.mark.parametrize("dtype, loads", [(torch.float16, True), (torch.bfloat16, True), (torch.float64, True),
                                          (torch.float8_e4m3fn, True), (torch.float8_e5m2, True),
                                          (torch.complex64, False), (torch.int64, False), (torch.bool, False)])
def test_weight_dtypes(model_dir, dtype, loads):
    """Real floating types convert to the model's float32; complex (which would lose its imaginary part without a
    word), integer and boolean weights are refused."""
    state = {k: v.to(dtype) for k, v in read_state_dict(model_dir)[0].items()}
    save_file(state, str(model_dir / "model.safetensors"))
    if loads:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "discarding the imaginary part" or similar on the way
            BertForPreTraining.from_pretrained(model_dir)
    else:
        assert "non-float dtype" in load_error(model_dir)


def test_float64_weights_beyond_float32_range_are_refused(model_dir):
    state = read_state_dict(model_dir)[0]
    state = {k: v.double() for k, v in state.items()}
    state["bert.pooler.dense.weight"][0, 0] = 1e300  # finite in float64, inf once in the float32 model
    save_file(state, str(model_dir / "model.safetensors"))
    message = load_error(model_dir)
    assert "NaN or infinite" in message and "pooler.dense.weight" in message


# ---------------------------------------------------------------------------------------------- config.json


def write_config(model_dir: Path, **changes) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    for key, value in changes.items():
        if value is DROP:
            config.pop(key)
        else:
            config[key] = value
    (model_dir / "config.json").write_text(json.dumps(config))


DROP = object()
CONFIG_CASES = {
    "vocab_size missing": dict(vocab_size=DROP),
    "hidden_size missing": dict(hidden_size=DROP),
    "vocab_size a string": dict(vocab_size="120"),
    "vocab_size a float": dict(vocab_size=120.0),
    "vocab_size true": dict(vocab_size=True),
    "vocab_size null": dict(vocab_size=None),
    "vocab_size a list": dict(vocab_size=[120]),
    "hidden_size negative": dict(hidden_size=-32),
    "num_hidden_layers zero": dict(num_hidden_layers=0),
    "vocab_size 10**12": dict(vocab_size=10**12),
    "vocab_size 2**63": dict(vocab_size=2**63),
    "vocab_size 9 million": dict(vocab_size=9_000_000),
    "hidden_size 65536": dict(hidden_size=65536, num_attention_heads=1),
    "num_hidden_layers 1000": dict(num_hidden_layers=1000),
    "max_position_embeddings 1M": dict(max_position_embeddings=1_048_576),
    "hidden not divisible by heads": dict(num_attention_heads=3),
    "hidden_act unknown": dict(hidden_act="sigmoid"),
    "hidden_act a list": dict(hidden_act=["gelu"]),
    "dropout 1.5": dict(hidden_dropout_prob=1.5),
    "dropout NaN": dict(attention_probs_dropout_prob=float("nan")),
    "layer_norm_eps inf": dict(layer_norm_eps=float("inf")),
    "pad_token_id beyond vocab": dict(pad_token_id=120),
    "id2label a string": dict(id2label="abc"),
    "id2label bad keys": dict(id2label={"x": "a"}),
    "id2label with a gap": dict(id2label={"0": "a", "5": "b"}),
    "label2id bad values": dict(label2id={"a": "b"}),
    "model_type gpt2": dict(model_type="gpt2"),
    "position_embedding_type relative": dict(position_embedding_type="relative_key"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_config_json_bad_fields(model_dir, case):
    write_config(model_dir, **CONFIG_CASES[case])
    started = time.perf_counter()
    message = load_error(model_dir, cls=BertModel)
    assert time.perf_counter() - started < 10, "a hostile size was allocated before being refused"
    assert "config.json" in message, message  # the file, or "does config.json match the weights?"


@pytest.mark.parametrize("text", ["", "{", "not json", "[]", "[{}]", "null", "42", '"a string"', "[" * 100_000,
                                  '{"a":' * 100_000, b"\xff\xfe{}", "{'single': 'quotes'}"])
def test_config_json_that_is_not_a_config(model_dir, text):
    path = model_dir / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    message = load_error(model_dir)
    assert str(path) in message, message


def test_config_json_missing_or_a_directory(model_dir):
    path = model_dir / "config.json"
    path.unlink()
    assert str(path) in load_error(model_dir)
    path.mkdir()
    assert str(path) in load_error(model_dir)


# ---------------------------------------------------------------------------------------------- tokenizer files


def tokenizer_error(directory: Path) -> str:
    with pytest.raises(BertforgeError) as caught:
        Tokenizer.from_pretrained(directory)
    return str(caught.value)


def test_tokenizer_duplicates_and_missing_specials(tmp_path):
    """tests/tokenizer/test_files.py::test_vocab_txt_duplicates_and_missing_specials covers vocab.txt in depth; here the
    same problems once more through each file that can carry them."""
    assert "duplicate token 'river'" in tokenizer_error(write_vocab(tmp_path / "dup", SPECIALS + ["river", "river"]))
    for missing in SPECIALS:
        message = tokenizer_error(write_vocab(tmp_path / missing, [t for t in SPECIALS if t != missing] + ["river"]))
        assert "vocab.txt" in message and missing in message
    blank = write_vocab(tmp_path / "blank", SPECIALS + ["river", "", "", "stone"])
    assert "duplicate token ''" in tokenizer_error(blank)


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tokjson")
    tok = Tokenizer.train(iter(["river stone light garden window"] * 20), vocab_size=60, show_progress=False)
    tok.save_pretrained(root)
    return json.loads((root / "tokenizer.json").read_text())


def write_tokenizer_json(directory: Path, data: dict | str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(data if isinstance(data, str) else json.dumps(data))
    return directory


@pytest.mark.parametrize("bad_id", [-1, 2**40, "x", None])
def test_tokenizer_json_ids_that_are_not_ids(tmp_path, tokenizer_json, bad_id):
    data = json.loads(json.dumps(tokenizer_json))
    data["model"]["vocab"]["zzz"] = bad_id
    message = tokenizer_error(write_tokenizer_json(tmp_path, data))
    assert "tokenizer.json" in message


def test_tokenizer_json_without_mask(tmp_path, tokenizer_json):
    data = json.loads(json.dumps(tokenizer_json))
    del data["model"]["vocab"]["[MASK]"]
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "[MASK]"]
    message = tokenizer_error(write_tokenizer_json(tmp_path, data))
    assert "tokenizer.json" in message and "[MASK]" in message


@pytest.mark.parametrize("change", ["two tokens one id", "an id past the end"])
def test_tokenizer_json_vocabulary_ids_must_be_0_to_n(tmp_path, tokenizer_json, change):
    data = json.loads(json.dumps(tokenizer_json))
    vocab = data["model"]["vocab"]
    vocab["zzz"] = 7 if change == "two tokens one id" else len(vocab) + 1000
    assert "tokenizer.json" in tokenizer_error(write_tokenizer_json(tmp_path, data))


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"])
def test_tokenizer_files_nested_too_deeply(tmp_path, name):
    write_vocab(tmp_path, SPECIALS + ["river"])
    (tmp_path / name).write_text("[" * 100_000)
    assert name in tokenizer_error(tmp_path)


# ---------------------------------------------------------------------------------------------- pickles and shards


class RunsCode:
    """Unpickling this object would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["torch.save", "plain pickle", "inside a state dict"])
def test_pytorch_model_bin_that_would_run_code(model_dir, tmp_path, how):
    marker = tmp_path / "code-ran"
    state = read_state_dict(model_dir)[0]
    (model_dir / "model.safetensors").unlink()
    target = model_dir / "pytorch_model.bin"
    if how == "torch.save":
        torch.save({"weights": RunsCode(marker)}, target)
    elif how == "plain pickle":
        target.write_bytes(pickle.dumps({"weights": RunsCode(marker)}, protocol=2))
    else:
        torch.save({**state, "cls.predictions.bias": RunsCode(marker)}, target)
    message = load_error(model_dir)
    assert not marker.exists(), "the pickle ran code"
    assert str(target) in message and "refused to load" in message, message
    # and a genuine pickle of plain tensors is accepted, every weight as saved
    torch.save(state, target)
    assert not tensors_differ(BertForPreTraining.from_pretrained(model_dir).state_dict(), state)


@pytest.mark.parametrize("shard", ["../x.safetensors", "../../etc/passwd", "/etc/passwd", "sub/x.safetensors",
                                   "..\\x.safetensors", "..", ".", "", None, 7, ["x.safetensors"],
                                   {"a": "x.safetensors"}, "x\u0000.safetensors"])
def test_shard_index_names_outside_the_model_directory(model_dir, tmp_path, shard):
    outside = tmp_path / "x.safetensors"
    shutil.copy(model_dir / "model.safetensors", outside)  # would load fine if it were reached
    (model_dir / "model.safetensors").unlink()
    index = model_dir / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"bert.embeddings.word_embeddings.weight": shard,
                                                "bert.pooler.dense.weight": "model-00001.safetensors"}}))
    message = load_error(model_dir)
    assert str(index) in message and "not a plain file name in the model directory" in message, message


def test_shard_index_that_is_fine_loads(model_dir):
    (model_dir / "model.safetensors").rename(model_dir / "model-00001-of-00001.safetensors")
    names = read_state_dict(model_dir / "model-00001-of-00001.safetensors")[0]
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: "model-00001-of-00001.safetensors" for k in names}}))
    model = BertForPreTraining.from_pretrained(model_dir)
    assert not tensors_differ(model.state_dict(), names) and not model.loading_info.missing_keys


# ---------------------------------------------------------------------------------------------- heads


HEADED = sorted(name for name in MODEL_CLASSES if name != "BertModel")


@pytest.mark.parametrize("name", HEADED)
def test_a_saved_head_loads_back_and_a_missing_one_is_reported(tmp_path, name):
    """Every tensor of a saved model comes back bit for bit, with nothing reported; a file without the head loads
    with the body as saved and the head's weights listed in `loading_info.missing_keys` and in a warning, never
    silently re-initialised."""
    cls = MODEL_CLASSES[name]
    torch.manual_seed(5)
    saved = cls(BertConfig(**TINY_CONFIG, num_labels=2 if name == "BertForQuestionAnswering" else 3))
    saved.save_pretrained(tmp_path)
    state = {k: v.detach().clone() for k, v in saved.state_dict().items()}
    with bertforge_warnings() as warned:
        again = cls.from_pretrained(tmp_path)
    assert not tensors_differ(state, again.state_dict())
    info = again.loading_info
    assert (info.missing_keys, info.unexpected_keys, info.mismatched_keys) == ([], [], []) and warned == []

    head = sorted(k for k in state if not k.startswith("bert."))
    assert head, f"{name} has no head weights to drop?"
    save_file({k: v for k, v in state.items() if k not in head}, str(tmp_path / "model.safetensors"))
    with bertforge_warnings() as warned:
        headless = cls.from_pretrained(tmp_path)
    assert sorted(headless.loading_info.missing_keys) == head
    assert len(warned) == 1 and all(k in warned[0] for k in head), warned
    body = {k: v for k, v in state.items() if k not in head}
    assert not tensors_differ(body, {k: v for k, v in headless.state_dict().items() if k not in head})
    outcome, problems = judge_load(headless, tmp_path, state, warned)
    assert outcome == "re-initialised, reported" and not problems, problems


# ---------------------------------------------------------------------------------------------- training checkpoints


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[tuple[Path, Path, Path], Path]:
    root = tmp_path_factory.mktemp("ckpt")
    inputs = make_run_inputs(root / "inputs")
    with one_torch_thread():
        pretrain(run_args(inputs, root / "run"))
    return inputs, root / "run"


def run_args(inputs, out: Path, **kw) -> PretrainArgs:
    return tiny_run_args(inputs, out, **{"max_steps": 4, "save_every": 2, "log_every": 2, **kw})


def resume_after_damage(finished_run, name: str, content: bytes) -> int:
    """Damage one file of the newest checkpoint (step-4), resume, put the file back; the step resumed from."""
    inputs, out = finished_run
    target = out / "checkpoints" / "step-4" / name
    good = target.read_bytes()
    target.write_bytes(content)
    try:
        with one_torch_thread():
            trainer = Pretrainer(run_args(inputs, out, resume=True))
            trainer.resume()
    finally:
        target.write_bytes(good)
    return trainer.step


@pytest.mark.parametrize("name, content", [
    pytest.param("model.safetensors", b"\x00" * 100, id="model.safetensors zeros"),
    pytest.param("optimizer.safetensors", b"junk", id="optimizer.safetensors junk"),
    pytest.param("optimizer.json", b"{", id="optimizer.json not JSON"),
    pytest.param("optimizer.json", b"[]", id="optimizer.json empty list"),
    pytest.param("trainer_state.json", b"\xff", id="trainer_state.json not UTF-8"),
    pytest.param("rng.json", b"{}", id="rng.json empty object"),
    pytest.param("data.json", b"[{}]", id="data.json empty state"),
    pytest.param("data.json", b"[" * 100_000, id="data.json nested 100000 deep"),
])
def test_resume_falls_back_from_a_damaged_newest_checkpoint(finished_run, name, content):
    assert resume_after_damage(finished_run, name, content) == 2


@pytest.mark.parametrize("name, content", [
    pytest.param("trainer_state.json", b"[]", id="trainer_state.json a list"),
    pytest.param("trainer_state.json", b'{"step": "x", "skipped_steps": 0, "tokens_seen": 0, "world_size": 1}',
                 id="trainer_state.json step a string"),
    pytest.param("scheduler.json", b"[]", id="scheduler.json a list"),
    pytest.param("rng.json", b"[]", id="rng.json empty list"),
    pytest.param("rng.json", b"[1]", id="rng.json a number"),
    pytest.param("data.json", b"[]", id="data.json empty list"),
    pytest.param("data.json", b"[null]", id="data.json null"),
])
def test_resume_falls_back_from_state_files_with_the_wrong_structure(finished_run, name, content):
    assert resume_after_damage(finished_run, name, content) == 2


def test_a_moved_run_directory_resumes(finished_run, tmp_path):
    inputs, run = finished_run
    moved = Path(shutil.copytree(run, tmp_path / "moved"))
    with one_torch_thread():
        trainer = Pretrainer(run_args(inputs, moved, resume=True))
        trainer.resume()
    assert trainer.step == 4


# ---------------------------------------------------------------------------------------------- mutation fuzzer

ODD_VALUES = [-1, 0, 1, 2, 3, 7, 10**9, 2**63, -(2**63), 1.5, 1e308, float("nan"), float("inf"), "x", "", None, [],
              {}, [1], {"0": "a"}, True, False, "gelu", 64, 32, 120, 9_000_000]
DTYPES = ["F16", "BF16", "F64", "I64", "I8", "BOOL", "U8", "F8_E4M3", "F8_E5M2", "C64", "F32", "X", 5, None]


def mutate_weights(rng: random.Random, blob: bytes) -> tuple[str, bytes]:
    n = struct.unpack("<Q", blob[:8])[0]
    kind = rng.choice(["flip header", "flip length", "flip body", "truncate", "insert", "delete", "append", "header"])
    data = bytearray(blob)
    if kind == "flip header":
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(8, 8 + n)
            data[i] ^= 1 << rng.randrange(8)
    elif kind == "flip length":
        data[rng.randrange(8)] ^= 1 << rng.randrange(8)
    elif kind == "flip body":
        for _ in range(rng.randint(1, 20)):
            i = rng.randrange(8 + n, len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del data[rng.randrange(len(data)) :]
    elif kind == "insert":
        i = rng.randrange(8 + n) if rng.random() < 0.5 else rng.randrange(len(data))
        data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == "delete":
        i = rng.randrange(len(data))
        del data[i : i + rng.randint(1, 64)]
    elif kind == "append":
        data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    else:  # a well-formed header that lies
        header, body = header_of(blob)
        name = rng.choice(list(header))
        if name == "__metadata__":
            header[name] = {"format": rng.choice(ODD_VALUES)}
        else:
            entry, field = header[name], rng.choice(["dtype", "shape", "data_offsets", "drop", "duplicate", "rename"])
            if field == "dtype":
                entry["dtype"] = rng.choice(DTYPES)
            elif field == "shape":
                entry["shape"] = rng.choice([[], [0], [-1], [2**40, 2**40], [1] * 40, entry["shape"][::-1],
                                             [entry["shape"][0] + 1, *entry["shape"][1:]], "x", None])
            elif field == "data_offsets":
                s, e = entry["data_offsets"]
                entry["data_offsets"] = rng.choice([[e, s], [s, e + 4], [s - 4, e - 4], [0, 0], [s, 2**63], [-1, e],
                                                    "x", [s]])
            elif field == "drop":
                del header[name]
            elif field == "duplicate":
                header[name + ".copy"] = dict(entry)
            else:
                header["../" + name] = header.pop(name)
        data = bytearray(with_header(header, body))
    return f"weights: {kind}", bytes(data)


def mutate_config(rng: random.Random, text: str) -> tuple[str, bytes]:
    kind = rng.choice(["drop", "set", "set several", "truncate", "flip", "replace"])
    config = json.loads(text)
    if kind == "drop":
        config.pop(rng.choice(list(config)))
    elif kind in ("set", "set several"):
        for _ in range(1 if kind == "set" else 3):
            config[rng.choice(list(config))] = rng.choice(ODD_VALUES)
    elif kind == "truncate":
        return f"config: {kind}", text.encode()[: rng.randrange(len(text))]
    elif kind == "flip":
        data = bytearray(text.encode())
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return f"config: {kind}", bytes(data)
    else:
        return f"config: {kind}", rng.choice([b"[]", b"null", b"1", b'"x"', b"", b"{", b"\xff\xfe", b"[{}]"])
    return f"config: {kind}", json.dumps(config).encode()


def mutate_bytes(rng: random.Random, blob: bytes) -> tuple[str, bytes]:
    """Format-blind damage, for the pickle-in-a-zip of pytorch_model.bin."""
    data, kind = bytearray(blob), rng.choice(["flip", "flip many", "truncate", "insert"])
    if kind == "flip":
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "flip many":
        for _ in range(20):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del data[rng.randrange(len(data)) :]
    else:
        i = rng.randrange(len(data))
        data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return f"pytorch_model.bin: {kind}", bytes(data)


def mutate_index(rng: random.Random, index: dict) -> tuple[str, bytes]:
    index = json.loads(json.dumps(index))
    kind = rng.choice(["shard name", "drop entry", "weight_map", "truncate"])
    names = list(index["weight_map"])
    if kind == "shard name":
        index["weight_map"][rng.choice(names)] = rng.choice(
            ["../model-1.safetensors", "/etc/passwd", "missing.safetensors", "", ".", "a/b", *ODD_VALUES])
    elif kind == "drop entry":
        del index["weight_map"][rng.choice(names)]
    elif kind == "weight_map":
        index["weight_map"] = rng.choice(ODD_VALUES)
    else:
        text = json.dumps(index).encode()
        return f"index: {kind}", text[: rng.randrange(len(text))]
    return f"index: {kind}", json.dumps(index).encode()


@pytest.fixture(scope="module")
def formats(pristine, tmp_path_factory) -> dict[str, object]:
    """The pristine weights as the three layouts a model directory can hold."""
    state = read_state_dict(pristine)[0]
    root = tmp_path_factory.mktemp("formats")
    torch.save(state, root / "pytorch_model.bin")
    names = sorted(state)
    shards = {"model-1.safetensors": names[::2], "model-2.safetensors": names[1::2]}
    blobs = {}
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(root / shard))
        blobs[shard] = (root / shard).read_bytes()
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    return {"safetensors": (pristine / "model.safetensors").read_bytes(), "config": (pristine / "config.json").read_text(),
            "bin": (root / "pytorch_model.bin").read_bytes(), "shards": blobs, "index": index}


def damaged_checkpoint(rng: random.Random, formats: dict, directory: Path) -> list[str]:
    """Write a damaged model directory (one of the three layouts; weights, config.json or both damaged)."""
    for old in directory.iterdir():
        old.unlink()
    what, config = [], formats["config"].encode()
    layout = rng.choices(["safetensors", "bin", "shards"], weights=[6, 2, 2])[0]
    roll = rng.random()
    damage_weights, damage_config = roll < 0.65, roll > 0.45
    if layout == "safetensors":
        label, blob = mutate_weights(rng, formats["safetensors"]) if damage_weights else ("", formats["safetensors"])
        (directory / "model.safetensors").write_bytes(blob)
    elif layout == "bin":
        label, blob = mutate_bytes(rng, formats["bin"]) if damage_weights else ("", formats["bin"])
        (directory / "pytorch_model.bin").write_bytes(blob)
    else:
        label, index = "", json.dumps(formats["index"]).encode()
        shards = dict(formats["shards"])
        if damage_weights and rng.random() < 0.5:
            label, index = mutate_index(rng, formats["index"])
        elif damage_weights:
            victim = rng.choice(sorted(shards))
            label, shards[victim] = mutate_weights(rng, shards[victim])
            label = f"{victim} {label}"
        (directory / "model.safetensors.index.json").write_bytes(index)
        for name, blob in shards.items():
            (directory / name).write_bytes(blob)
    if label:
        what.append(label)
    if damage_config:
        label, config = mutate_config(rng, formats["config"])
        what.append(label)
    (directory / "config.json").write_bytes(config)
    return [f"[{layout}]", *what]


def fuzz(formats: dict, directory: Path, count: int, seed: int) -> None:
    """Each damaged checkpoint is refused with a BertforgeError or loads; a load is judged by `judge_load`: the
    same tensors as saved, the damaged file's own tensors (damage no loader can see), or weights re-initialised
    and reported. A weight re-initialised or changed without a word is a failure, as is any other exception."""
    rng = random.Random(seed)
    outcomes, crashes, silent, slowest, layouts = Counter(), [], [], (0.0, ""), Counter()
    pristine = load_file_bytes(formats["safetensors"])
    directory.mkdir()
    started = time.perf_counter()
    for i in range(count):
        what = damaged_checkpoint(rng, formats, directory)
        layouts[what[0]] += 1
        cls = rng.choice([BertForPreTraining, BertModel, BertForSequenceClassification])
        t = time.perf_counter()
        try:
            with warnings.catch_warnings(), bertforge_warnings() as warned:
                warnings.simplefilter("ignore")
                model = cls.from_pretrained(directory)
        except BertforgeError:
            outcomes["refused"] += 1
        except Exception as err:  # what this test hunts
            crashes.append(f"#{i} {' + '.join(what)} -> {type(err).__name__}: {str(err)[:200]}")
        else:
            outcome, problems = judge_load(model, directory, pristine, warned)
            outcomes[outcome] += 1
            if problems:
                silent.append(f"#{i} {' + '.join(what)} -> {cls.__name__}: {'; '.join(problems[:3])}")
        slowest = max(slowest, (time.perf_counter() - t, " + ".join(what)))
    seconds = time.perf_counter() - started
    loaded = ", ".join(f"{k} {outcomes[k]}" for k in ("same as saved", "as the damaged file says",
                                                     "re-initialised, reported"))
    report(f"corrupt files tried {count}, non-BertforgeError crashes {len(crashes)}, silently changed weights "
           f"{len(silent)} (refused {outcomes['refused']}; loaded: {loaded}; layouts "
           f"{', '.join(f'{k} {v}' for k, v in sorted(layouts.items()))}; slowest {slowest[0]:.2f}s: {slowest[1]}; "
           f"{seconds:.1f}s)")
    assert not crashes, "\n".join(crashes[:20])
    assert not silent, "\n".join(silent[:20])
    assert slowest[0] < 10, f"a damaged checkpoint took {slowest[0]:.1f}s to refuse: {slowest[1]}"


def load_file_bytes(blob: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    return load(blob)


def test_mutation_fuzzer_fast(formats, tmp_path):
    fuzz(formats, tmp_path / "fuzz", count=100, seed=1)


@pytest.mark.slow
def test_mutation_fuzzer_2000(formats, tmp_path):
    fuzz(formats, tmp_path / "fuzz", count=2000, seed=2)
