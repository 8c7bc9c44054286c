"""What users do wrong with the commands' files and settings (the issue "Reliability III"): an output that would
replace the command's own input or a file of the model, a tokenizer written over a model's vocabulary, a resumed
fine-tuning run whose data changed, labels that are numbers but one, embeddings trained on batches with no negative,
inputs no writer could encode, and limits named wrongly. Each ends in one error line naming the input and the real
limit (non-zero exit, nothing written), or a loud warning where the run is still useful.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.reliability.rel_helpers import one_torch_thread
from tests.reliability.test_rel_cli import assert_one_line_error, invoke


def write(path: Path, content: str) -> Path:
    path.write_text(content, encoding="utf-8")
    return path


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------------- outputs


def test_predict_refuses_to_write_over_its_input_or_into_the_model(tmp_path, capsys, model_dirs):
    classifier = model_dirs["classifier"]
    data = write(tmp_path / "in.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in ("river stone", "light")))
    before, model_before = data.read_bytes(), tree(classifier)
    base = ["predict", "--task", "classification", "--model", str(classifier), "--input", str(data), "--no-progress"]
    rc, _, err = invoke([*base, "--out", str(data)], capsys)
    assert_one_line_error("predict", rc, err, f"--out {data}", "is the input file")
    alias = tmp_path / "sub" / ".." / "in.jsonl"  # the same file, spelled otherwise
    (tmp_path / "sub").mkdir()
    rc, _, err = invoke([*base, "--out", str(alias)], capsys)
    assert_one_line_error("predict", rc, err, "is the input file")
    assert data.read_bytes() == before
    rc, _, err = invoke([*base, "--out", str(classifier / "config.json")], capsys)
    assert_one_line_error("predict", rc, err, "config.json", f"inside the model directory {classifier}")
    assert tree(classifier) == model_before
    with one_torch_thread():
        rc, _, err = invoke([*base, "--out", str(tmp_path / "predictions.jsonl")], capsys)
    assert rc == 0, err


def test_embed_export_and_attention_refuse_an_output_inside_the_model(tmp_path, capsys, model_dirs):
    """The same check (one helper) guards every command that writes a file beside a model it reads."""
    model = model_dirs["pretrained"]
    before = tree(model)
    texts = write(tmp_path / "t.txt", "river stone\n")
    cases = {
        "embed": ["--input", str(texts), "--out", str(model / "vectors.npy")],
        "export-onnx": ["--out", str(model / "model.onnx")],
        "attention": ["--text", "river stone", "--out", str(model / "attention.png")],
    }
    for command, args in cases.items():
        rc, _, err = invoke([command, "--model", str(model), *args], capsys)
        assert_one_line_error(command, rc, err, "inside the model directory")
    assert tree(model) == before


def test_predict_writes_a_lone_surrogate_of_its_json_input(tmp_path, capsys, model_dirs):
    """"\\ud800" is valid JSON but no UTF-8: the predictions are written, the text escaped so that it reads back."""
    data = write(tmp_path / "in.jsonl", '{"text": "river \\ud800 stone"}\n{"text": "caf\\u00e9 light"}\n')
    output = tmp_path / "out.jsonl"
    with one_torch_thread():
        rc, _, err = invoke(["predict", "--task", "classification", "--model", str(model_dirs["classifier"]),
                             "--input", str(data), "--out", str(output), "--no-progress"], capsys)
    assert rc == 0, err
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [r["text"] for r in rows] == ["river \ud800 stone", "café light"]
    assert "café" in output.read_text(encoding="utf-8")  # only the record that needs it is escaped


def test_train_tokenizer_refuses_a_model_directory_without_overwrite(tmp_path, capsys, model_dirs):
    import shutil

    model = Path(shutil.copytree(model_dirs["pretrained"], tmp_path / "model"))
    before = tree(model)
    argv = ["train-tokenizer", "--corpus", str(model_dirs["corpus"]), "--vocab-size", "60", "--out", str(model)]
    rc, _, err = invoke(argv, capsys)
    assert_one_line_error("train-tokenizer", rc, err, f"--out {model} holds a model", "config.json",
                          "model.safetensors", "--overwrite")
    assert tree(model) == before
    rc, _, err = invoke([*argv, "--overwrite"], capsys)
    assert rc == 0, err
    assert (model / "vocab.txt").read_bytes() != before["vocab.txt"]
    rc, _, err = invoke([*argv[:-1], str(tmp_path / "fresh")], capsys)  # a new directory needs no --overwrite
    assert rc == 0, err


# ---------------------------------------------------------------------------------------------------- labels

WORDS6 = ["river stone", "light garden", "window morning", "letter winter", "castle forest", "ship market"]


def labelled_tsv(path: Path, labels: list[str]) -> Path:
    return write(path, "sentence\tlabel\n" + "".join(f"{WORDS6[i % 6]} {i}\t{y}\n" for i, y in enumerate(labels)))


@pytest.mark.parametrize("odd", ["nan", "inf", "n/a", "-"])
@pytest.mark.parametrize("numbers", [["0", "1"], ["0.25", "3.5", "1.0"]], ids=["classes", "regression"])
def test_numeric_labels_with_one_non_number_are_refused_naming_its_line(tmp_path, odd, numbers):
    from bertforge.core.errors import BertforgeError
    from bertforge.finetune.config import DataOptions
    from bertforge.finetune.tasks import get_task

    labels = [numbers[i % len(numbers)] for i in range(20)]
    labels[13] = odd
    path = labelled_tsv(tmp_path / "train.tsv", labels)
    task = get_task("classification")
    examples, _ = task.read(path, DataOptions(), labelled=True)
    with pytest.raises(BertforgeError) as err:
        task.label_overrides(examples, path)
    message = str(err.value)
    assert message.startswith(f"{path}:15: label {odd!r} is not a") and "19 of the 20 labels are numbers" in message
    # words are class names, and a few numbers among them are too
    labels = ["neg", "pos"] * 9 + ["0", "1"]
    examples, _ = task.read(labelled_tsv(tmp_path / "words.tsv", labels), DataOptions(), labelled=True)
    assert task.label_overrides(examples, path)["id2label"] == {0: "0", 1: "1", 2: "neg", 3: "pos"}


def test_cli_finetune_refuses_numeric_labels_with_a_nan(tmp_path, capsys, model_dirs):
    labels = ["0", "1"] * 10
    labels[6] = "nan"
    train = labelled_tsv(tmp_path / "train.tsv", labels)
    dev = labelled_tsv(tmp_path / "dev.tsv", ["0", "1"] * 3)
    out = tmp_path / "run"
    rc, _, err = invoke(["finetune", "--task", "classification", "--model", str(model_dirs["pretrained"]), "--train",
                         str(train), "--dev", str(dev), "--out", str(out), "--epochs", "1", "--no-progress"], capsys)
    assert_one_line_error("finetune", rc, err, f"{train}:8: label 'nan' is not a finite number")
    assert not out.exists()


def test_evaluate_maps_integer_labels_onto_transformers_default_label_names(tmp_path, capsys, model_dirs):
    """A model whose labels are LABEL_0..LABEL_{n-1} (what transformers writes when given no names) scores a file
    labelled 0..n-1; a label beyond them is still refused, naming the known ones."""
    import torch

    from bertforge import BertConfig, BertForSequenceClassification
    from bertforge.tokenizer import Tokenizer
    from tests.helpers import TINY_CONFIG

    torch.manual_seed(0)
    config = BertConfig(**TINY_CONFIG, id2label={0: "LABEL_0", 1: "LABEL_1"},
                        architectures=["BertForSequenceClassification"])
    model = tmp_path / "model"
    BertForSequenceClassification(config).save_pretrained(model)
    Tokenizer.from_pretrained(model_dirs["classifier"]).save_pretrained(model)
    base = ["evaluate", "--task", "classification", "--model", str(model), "--no-progress", "--input"]
    with one_torch_thread():
        rc, out, err = invoke([*base, str(labelled_tsv(tmp_path / "d.tsv", ["0", "1"] * 4))], capsys)
        assert rc == 0, err
        assert 0 <= json.loads(out)["accuracy"] <= 1
        bad = labelled_tsv(tmp_path / "bad.tsv", ["0", "1", "2"])
        rc, _, err = invoke([*base, str(bad)], capsys)
    assert_one_line_error("evaluate", rc, err, f"{bad}:4: label '2' was not seen in training", "LABEL_0, LABEL_1")


# ---------------------------------------------------------------------------------------------------- limits


def test_pretrain_names_a_roberta_checkpoints_real_sequence_limit(tmp_path, capsys, model_dirs):
    """RoBERTa's positions start after the padding id: 128 positions hold sequences of 126 tokens, as finetune,
    embed and serve say."""
    from bertforge import BertConfig, BertForMaskedLM
    from tests.helpers import TINY_CONFIG

    config = BertConfig(**{**TINY_CONFIG, "max_position_embeddings": 128}, model_type="roberta", pad_token_id=1)
    assert config.max_sequence_length == 126
    BertForMaskedLM(config).save_pretrained(tmp_path / "roberta")
    rc, _, err = invoke(["pretrain", "--init-from", str(tmp_path / "roberta"), "--corpus", str(model_dirs["corpus"]),
                         "--out", str(tmp_path / "run"), "--max-length", "127", "--max-steps", "1"], capsys)
    assert_one_line_error("pretrain", rc, err, "--max-length 127 exceeds the longest sequence the model takes (126",
                          "max_position_embeddings 128")
    assert not (tmp_path / "run").exists()


def test_pretrain_eval_fraction_leaving_nothing_to_train_on_says_so(tmp_path, capsys, model_dirs):
    """A 200-line corpus without blank lines is one document: --eval-fraction 0.99 holds it out, and the error says
    that (not "no text")."""
    from tests.helpers import make_run_inputs

    _, tok, config = make_run_inputs(tmp_path / "inputs")
    lines = model_dirs["corpus"].read_text().split()
    corpus = write(tmp_path / "lines.txt", "".join(" ".join(lines[i : i + 6]) + "\n" for i in range(0, 1200, 6)))
    assert len(corpus.read_text().splitlines()) == 200
    base = ["pretrain", "--corpus", str(corpus), "--tokenizer", str(tok), "--config", str(config), "--max-length", "32",
            "--batch-size", "4", "--max-steps", "1", "--no-nsp"]
    rc, _, err = invoke([*base, "--out", str(tmp_path / "run"), "--eval-fraction", "0.99"], capsys)
    line = assert_one_line_error("pretrain", rc, err, f"corpus {corpus} has no document left to read: 0 of its 1 "
                                 "document (--eval-fraction 0.99 holds out the others)", "without blank lines")
    assert "has no text" not in line and not (tmp_path / "run").exists()


def test_a_sentence_transformers_max_seq_length_beyond_the_positions_is_capped(tmp_path, capsys, caplog, model_dirs):
    """sentence_bert_config.json asking for 512 tokens of a 64-position model: capped at 64 (as
    sentence-transformers does) when the user gave no length, with a warning; an explicit --max-length is checked."""
    import shutil

    from bertforge.model.pooling import write_sentence_transformers_files
    from bertforge.pipelines import pipeline
    from tests.helpers import TINY_CONFIG

    model = Path(shutil.copytree(model_dirs["pretrained"], tmp_path / "st"))
    write_sentence_transformers_files(model, TINY_CONFIG["hidden_size"], "mean", True, 512)
    texts = write(tmp_path / "t.txt", "river stone\nlight garden window\n")
    with one_torch_thread():
        assert pipeline("embed", model=model).max_length == TINY_CONFIG["max_position_embeddings"]
        rc, _, err = invoke(["embed", "--model", str(model), "--input", str(texts), "--out", str(tmp_path / "e.npy")],
                            capsys)
        assert rc == 0, err
        assert "max_seq_length 512 is beyond this model's 64 positions" in caplog.text
        rc, _, err = invoke(["embed", "--model", str(model), "--input", str(texts), "--out", str(tmp_path / "f.npy"),
                             "--max-length", "512"], capsys)
    assert_one_line_error("embed", rc, err, "max_length must be an integer in 3..64", "got 512")
    write_sentence_transformers_files(model, TINY_CONFIG["hidden_size"], "mean", True, 16)
    assert pipeline("embed", model=model).max_length == 16  # a length within the limit is kept


def test_pretrain_resume_on_a_changed_corpus_is_one_line(tmp_path, capsys):
    """A changed corpus is not a damaged checkpoint: no "trying the previous one" warnings, one line naming it."""
    from tests.helpers import make_run_inputs

    corpus, tok, config = make_run_inputs(tmp_path / "inputs")
    out = tmp_path / "run"
    base = ["pretrain", "--corpus", str(corpus), "--tokenizer", str(tok), "--config", str(config), "--max-length", "32",
            "--batch-size", "4", "--max-steps", "2", "--save-every", "1", "--out", str(out), "--no-progress"]
    with one_torch_thread():
        rc, _, err = invoke(base, capsys)
    assert rc == 0, err
    with open(corpus, "a", encoding="utf-8") as fh:
        fh.write("\nriver stone light garden .\n")
    rc, _, err = invoke([*base, "--resume", "--max-steps", "3"], capsys)
    assert_one_line_error("pretrain", rc, err, "cannot resume: the corpus differs from the checkpoint's",
                          f"was {corpus.name} (")


@pytest.mark.parametrize("kind, preset, changed, named", [
    ("modernbert", "modernbert-tiny", ["--mlm-probability", "0.2"], "mlm_probability: None -> 0.2"),
    ("deberta", "deberta-v3-tiny", ["--rtd-weight", "10"], "rtd_weight: 50.0 -> 10.0"),
])
def test_new_families_refuse_a_resume_with_other_settings_and_a_tokenizer_that_does_not_fit(
        tmp_path, capsys, kind, preset, changed, named):
    """The families of this round get the guarantees of the others (#34): --resume with a setting that changes the
    run is one line naming it; a tokenizer of another family's kind, or larger than the model's vocabulary, is
    refused before anything is written."""
    from bertforge.tokenizer import Tokenizer
    from tests.helpers import make_corpus

    corpus = make_corpus(tmp_path / "corpus.txt")
    tok = tmp_path / "tok"
    Tokenizer.train([str(corpus)], vocab_size=300, show_progress=False, kind=kind).save_pretrained(tok)
    out = tmp_path / "run"
    base = ["pretrain", "--corpus", str(corpus), "--tokenizer", str(tok), "--config", preset, "--max-length", "32",
            "--batch-size", "4", "--max-steps", "2", "--save-every", "1", "--out", str(out), "--no-progress"]
    with one_torch_thread():
        rc, _, err = invoke(base, capsys)
    assert rc == 0, err
    rc, _, err = invoke([*base, "--resume", "--max-steps", "3", *changed], capsys)
    assert_one_line_error("pretrain", rc, err, "--resume with settings that differ from the run", named)
    from bertforge.data.demo_world import DEMO_CORPUS
    bigger = tmp_path / "bigger"  # the same kind, trained on more text: more ids than the model has rows for
    Tokenizer.train([str(DEMO_CORPUS)], vocab_size=600, show_progress=False, kind=kind).save_pretrained(bigger)
    other = tmp_path / "other"
    rc, _, err = invoke(["pretrain", "--corpus", str(corpus), "--tokenizer", str(bigger), "--init-from",
                         str(out / "model"), "--max-length", "32", "--batch-size", "4", "--max-steps", "2", "--out",
                         str(other), "--no-progress"], capsys)
    assert_one_line_error("pretrain", rc, err, "vocabulary")
    assert not other.exists()


# ---------------------------------------------------------------------------------------------------- embeddings

PAIRS = [("river stone light", "garden window"), ("morning letter", "winter castle forest"),
         ("ship market song", "river light"), ("stone garden", "window morning letter"),
         ("castle winter", "forest ship"), ("market song river", "stone light garden")]


def pairs_tsv(path: Path, rows: list[tuple[str, str]], header: str = "anchor\tpositive") -> Path:
    return write(path, header + "\n" + "".join(f"{a}\t{b}\n" for a, b in rows))


@pytest.mark.parametrize("case", ["one pair", "the same pair", "batch size 1"])
def test_train_embeddings_refuses_batches_without_an_in_batch_negative(tmp_path, capsys, model_dirs, case):
    rows = {"one pair": PAIRS[:1], "the same pair": PAIRS[:1] * 6, "batch size 1": PAIRS}[case]
    train = pairs_tsv(tmp_path / "pairs.tsv", rows)
    out = tmp_path / "out"
    extra = ["--batch-size", "1"] if case == "batch size 1" else ["--batch-size", "4"]
    with one_torch_thread():
        rc, _, err = invoke(["train-embeddings", "--model", str(model_dirs["pretrained"]), "--train", str(train),
                             "--out", str(out), "--epochs", "1", "--no-progress", *extra], capsys)
    why = {"one pair": "its only pair", "the same pair": "every pair shares a text", "batch size 1": "--batch-size 1"}
    assert_one_line_error("train-embeddings", rc, err, "every batch holds one pair", why[case],
                          "in-batch negatives (--loss mnrl) need at least two distinct pairs per batch")
    assert not out.exists()


def test_train_embeddings_plan_line_counts_the_batches_that_run(tmp_path, capsys, caplog, model_dirs):
    """12 anchors sharing 2 positives, batches of 4: no batch may hold a positive twice, so an epoch is 6 steps of 2
    pairs, not 3 of 4; the plan line says 6."""
    import logging

    rows = [(f"{PAIRS[i % 6][0]} {i}", ("window morning", "forest ship")[i % 2]) for i in range(12)]
    train = pairs_tsv(tmp_path / "pairs.tsv", rows)
    with one_torch_thread(), caplog.at_level(logging.INFO, logger="bertforge"):
        rc, out, err = invoke(["train-embeddings", "--model", str(model_dirs["pretrained"]), "--train", str(train),
                               "--out", str(tmp_path / "out"), "--epochs", "1", "--batch-size", "4", "--no-progress"],
                              capsys)
    assert rc == 0, err
    plan = [r.getMessage() for r in caplog.records if " epoch(s) x " in r.getMessage()]
    assert plan == [plan[0]] and "train-embeddings on 12 examples: 1 epoch(s) x 6 step(s)" in plan[0], plan
    assert json.loads(out)["train_steps"] == 6


def test_train_embeddings_reads_a_header_of_other_column_names_as_a_header(tmp_path):
    from bertforge.embeddings_train.data import read_pairs

    data = read_pairs(pairs_tsv(tmp_path / "en_fr.tsv", PAIRS[:3], header="english\tfrench"))
    assert len(data) == 3 and data.texts[0][0] == PAIRS[0][0] and data.lines == [2, 3, 4]
    one_word = read_pairs(pairs_tsv(tmp_path / "words.tsv", [("river", "stone"), ("light", "garden")], header="cat\tdog"))
    assert len(one_word) == 3  # single words everywhere: no telling a header from a pair, so every row is data
