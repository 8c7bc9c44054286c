"""`bertforge train-embeddings`: the losses against sentence-transformers' own, gradient caching against the plain
loss, a short run that learns a toy retrieval task, the sentence-transformers round trip, and bad input refused.

Everything runs on a tiny random BERT (2 layers, 32 wide) and data made here."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertModel
from bertforge.cli import main
from bertforge.embeddings_train import EmbeddingsConfig
from bertforge.embeddings_train.data import normalized_scores, read_pairs
from bertforge.embeddings_train.evaluation import retrieval_metrics, retrieval_task
from bertforge.embeddings_train.losses import make_loss
from bertforge.embeddings_train.trainer import EmbeddingTraining, distinct_batches, encode_pairs
from bertforge.errors import BertforgeError
from bertforge.pooling import write_sentence_transformers_files
from bertforge.tokenizer import Tokenizer
from tests.helpers import SPECIALS, tiny_config, write_uncased_tokenizer

st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")

N = 16  # anchors a0..a15, each paired with one of b0..b15 (a fixed random permutation): learnable, no shared token
A = [f"a{i}" for i in range(N)]
B = [f"b{i}" for i in range(N)]
FILLERS = "the is here there now see some one with and".split()
VOCAB = SPECIALS + A + B + FILLERS
PERMUTATION = random.Random(0).sample(range(N), N)
TRAIN_TEMPLATES = [("the {} is here", "{} there"), ("{} now", "see {}"), ("some {}", "one {} with"), ("{} and the", "{} is")]
DEV_TEMPLATES = [("the {} now", "see {} here")]  # the same pairs in words never seen together in training


def pairs(templates: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(ta.format(A[i]), tb.format(B[PERMUTATION[i]])) for ta, tb in templates for i in range(N)]


def write_tsv(path: Path, rows: list[tuple], header: str | None = None) -> Path:
    lines = ([header] if header else []) + ["\t".join(str(c) for c in row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_model(directory: Path, **config) -> Path:
    write_uncased_tokenizer(directory, VOCAB)
    torch.manual_seed(0)
    BertModel(tiny_config(vocab_size=len(VOCAB), **config)).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("toy")
    return (write_tsv(root / "train.tsv", pairs(TRAIN_TEMPLATES), "anchor\tpositive"),
            write_tsv(root / "dev.tsv", pairs(DEV_TEMPLATES)))


@pytest.fixture(scope="module")
def trained(tiny, toy, tmp_path_factory) -> Path:
    """A short run on the toy task through the command line, with most training options set."""
    out = tmp_path_factory.mktemp("runs") / "trained"
    rc = main(["train-embeddings", "--model", str(tiny), "--train", str(toy[0]), "--dev", str(toy[1]), "--out", str(out),
               "--epochs", "6", "--batch-size", "16", "--lr", "1e-3", "--warmup-ratio", "0.1", "--weight-decay", "0.01",
               "--seed", "1", "--log-every", "2", "--eval-every", "8", "--early-stop", "20", "--eval-batch-size", "8",
               "--max-length", "16", "--pooling", "mean", "--max-skipped-steps", "3", "--device", "cpu",
               "--no-progress"])
    assert rc == 0
    return out


# ---------------------------------------------------------------------------------------------------- losses


def _st_loss(name: str, **kwargs):
    losses = st.sentence_transformer.losses
    return getattr(losses, name)(model=None, **kwargs)


@pytest.mark.parametrize("columns", [2, 3, 4])
@pytest.mark.parametrize("symmetric", [False, True])
def test_mnrl_equals_sentence_transformers(columns, symmetric):
    torch.manual_seed(columns)
    emb = [torch.randn(8, 16, dtype=torch.float64) for _ in range(columns)]
    ours = make_loss("mnrl", scale=20.0, symmetric=symmetric)(emb, None)
    if symmetric:
        reference = _st_loss("MultipleNegativesRankingLoss", directions=("query_to_doc", "doc_to_query"),
                             partition_mode="per_direction")
    else:
        reference = _st_loss("MultipleNegativesRankingLoss")
    expected = reference.compute_loss_from_embeddings(emb, None)
    assert abs(ours.item() - expected.item()) < 1e-10


def test_scored_losses_equal_sentence_transformers():
    torch.manual_seed(0)
    a, b = torch.randn(12, 16, dtype=torch.float64), torch.randn(12, 16, dtype=torch.float64)
    labels = torch.tensor([0.0, 0.2, 0.2, 1.0, 0.6, 0.4, 0.8, 0.0, 1.0, 0.6, 0.1, 0.3], dtype=torch.float64)  # ties too
    for scale in (20.0, 7.0):
        ours = make_loss("cosent", scale=scale)([a, b], labels)
        expected = _st_loss("CoSENTLoss", scale=scale).compute_loss_from_embeddings([a, b], labels)
        assert abs(ours.item() - expected.item()) < 1e-9
    ours = make_loss("cosine")([a, b], labels)
    expected = _st_loss("CosineSimilarityLoss").compute_loss_from_embeddings([a, b], labels)
    assert abs(ours.item() - expected.item()) < 1e-7  # sentence-transformers casts the scores to float32


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory) -> Path:
    """The tiny model as a sentence-transformers directory (mean pooling, normalised)."""
    directory = make_model(tmp_path_factory.mktemp("st"))
    Tokenizer.from_pretrained(directory).save_pretrained(directory)
    write_sentence_transformers_files(directory, 32, "mean", True, 32)
    return directory


@pytest.mark.parametrize("loss", ["mnrl", "cosent"])
def test_matryoshka_equals_sentence_transformers(st_dir, loss):
    model = st.SentenceTransformer(str(st_dir), device="cpu").eval()
    dims = [32, 16, 8]
    texts = [[t for t, _ in pairs(DEV_TEMPLATES)[:8]], [t for _, t in pairs(DEV_TEMPLATES)[:8]]]
    labels = torch.linspace(0, 1, 8) if loss == "cosent" else None
    features = [model.tokenize(column) for column in texts]
    losses = st.sentence_transformer.losses
    inner = losses.CoSENTLoss(model) if loss == "cosent" else losses.MultipleNegativesRankingLoss(model)
    with torch.no_grad():
        expected = losses.MatryoshkaLoss(model, inner, matryoshka_dims=dims)(features, labels)
        embeddings = [model(dict(f))["sentence_embedding"] for f in features]
        ours = make_loss(loss, matryoshka_dims=dims)(embeddings, labels)
        single = make_loss(loss)([e[:, :16] for e in embeddings], labels)
    assert abs(ours.item() - expected.item()) < 1e-5
    assert ours.item() > single.item()  # the sum over three prefixes, not one


# ---------------------------------------------------------------------------------------------------- caching


def _training(model_dir: Path, data_file: Path, **settings) -> EmbeddingTraining:
    cfg = EmbeddingsConfig(model=str(model_dir), train=str(data_file), out="unused", **settings)
    tokenizer = Tokenizer.from_pretrained(model_dir)
    data = read_pairs(data_file)
    labels = normalized_scores(data, None) if data.shape == "scored" else None
    encoded = encode_pairs(tokenizer, data, 16, labels)
    model = BertModel.from_pretrained(model_dir, quiet=True)
    loss_name = "cosent" if data.shape == "scored" else "mnrl"
    loss = make_loss(loss_name, cfg.scale, cfg.symmetric, cfg.dims())
    return EmbeddingTraining(model, encoded, None, cfg, None, loss, "mean", torch.device("cpu"))


def _gradients(run: EmbeddingTraining, indices: list[int], seed: int = 0) -> tuple[float, dict[str, torch.Tensor]]:
    run.model.zero_grad(set_to_none=True)
    run.model.train()
    torch.manual_seed(seed)
    share = run.forward_backward(run.make_batch(indices), {"loss": 1.0})["loss"].item()
    return share, {n: p.grad.clone() for n, p in run.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("settings", [dict(symmetric=True), dict(matryoshka_dims="32,16")])
def test_cached_gradient_equals_plain_gradient(tmp_path, settings):
    model_dir = make_model(tmp_path / "m", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    rows = [(a, p, FILLERS[i % 10] + " " + n) for i, ((a, p), (_, n)) in enumerate(zip(pairs(TRAIN_TEMPLATES), pairs(DEV_TEMPLATES) * 4))]
    data_file = write_tsv(tmp_path / "triplets.tsv", rows[:40])
    indices = list(range(0, 40, 2))  # 20 examples, 60 texts
    plain_loss, plain = _gradients(_training(model_dir, data_file, **settings), indices)
    cached_loss, cached = _gradients(_training(model_dir, data_file, mini_batch_size=7, **settings), indices)
    assert abs(plain_loss - cached_loss) < 1e-6
    assert plain.keys() == cached.keys() and len(plain) > 10
    worst = max((plain[k] - cached[k]).abs().max().item() for k in plain)
    scale = max(v.abs().max().item() for v in plain.values())
    assert worst < 1e-6 * max(1.0, scale), worst


def test_fp16_cached_gradient_is_scaled_like_the_plain_one(tmp_path):
    """Under --precision fp16 the loss is scaled (2^16) before backward; gradient caching pushes its cached
    gradients in through `backward_from`, which must scale them alike: both then match fp32's gradient times the
    scale, within fp16's rounding."""
    model_dir = make_model(tmp_path / "m", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    data_file = write_tsv(tmp_path / "pairs.tsv", pairs(TRAIN_TEMPLATES)[:24])
    indices = list(range(24))
    _, fp32 = _gradients(_training(model_dir, data_file), indices)
    plain_loss, plain = _gradients(_training(model_dir, data_file, precision="fp16"), indices)
    cached_loss, cached = _gradients(_training(model_dir, data_file, precision="fp16", mini_batch_size=8), indices)
    assert abs(plain_loss - cached_loss) < 1e-2
    for got in (plain, cached):
        assert got.keys() == fp32.keys()
        diff = torch.cat([(got[k] / 2.0**16 - fp32[k]).flatten() for k in fp32]).norm()
        assert diff < 2e-2 * torch.cat([v.flatten() for v in fp32.values()]).norm(), diff


def test_cached_gradient_replays_the_dropout_masks(tmp_path, tiny):
    """With dropout on, each mini-batch's re-run with grad must draw the masks of its first run: the cached
    gradient then equals that of the loss on mini-batches embedded one after the other from the same seed."""
    data_file = write_tsv(tmp_path / "pairs.tsv", pairs(TRAIN_TEMPLATES)[:24])
    indices = list(range(24))
    run = _training(tiny, data_file, mini_batch_size=8)
    _, cached = _gradients(run, indices, seed=3)
    run.model.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    batch = run.make_batch(indices)
    embeddings = torch.cat([run.embed(batch.ids[i : i + 8]) for i in range(0, len(batch.ids), 8)])
    run.stepper.accumulate({"loss": run.batch_loss(batch, embeddings)}, {"loss": 1.0})
    reference = {n: p.grad for n, p in run.model.named_parameters() if p.grad is not None}
    assert max((reference[k] - cached[k]).abs().max().item() for k in reference) < 1e-6
    _, other_seed = _gradients(run, indices, seed=4)
    assert max((other_seed[k] - cached[k]).abs().max().item() for k in cached) > 1e-4  # dropout is really on


# ---------------------------------------------------------------------------------------------------- training


def test_training_raises_retrieval_mrr(trained):
    summary = json.loads((trained / "eval.json").read_text())
    before, best = summary["before"], summary["best"]["metrics"]
    assert summary["shape"] == "pairs" and summary["loss"] == "mnrl" and summary["main_metric"] == "mrr@10"
    assert before["mrr@10"] < 0.45 and best["mrr@10"] > before["mrr@10"] + 0.3, (before, best)
    assert set(best) == {"mrr@10", "ndcg@10", "recall@1", "recall@5", "recall@10"}
    rows = [json.loads(line) for line in (trained / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"type": "eval", "step": 0, "epoch": 0.0, **before}
    assert any(r["type"] == "train" and "loss" in r for r in rows)
    assert (trained / "training_curve.png").stat().st_size > 1000
    assert any((trained / "tensorboard").iterdir())
    saved = json.loads((trained / "train_embeddings_config.json").read_text())
    assert saved["max_length"] == 16 and saved["batch_size"] == 16


def test_sentence_transformers_loads_the_output_identically(trained):
    texts = [a for a, _ in pairs(DEV_TEMPLATES)] + ["the a3 and b4 is here now", "see"]
    model = st.SentenceTransformer(str(trained), device="cpu")
    reference = model.encode(texts, batch_size=5)
    ours = bertforge.pipeline("embed", model=trained)(texts)
    assert np.abs(reference - ours).max() <= 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # the Normalize module is there
    assert model.max_seq_length == 16
    modules = json.loads((trained / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]


def test_retrieval_metrics_equal_sentence_transformers_evaluator(trained, toy):
    data = read_pairs(toy[1])
    task = retrieval_task(data)
    model = st.SentenceTransformer(str(trained), device="cpu")
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    evaluator = InformationRetrievalEvaluator(
        queries={str(i): q for i, q in enumerate(task.queries)}, corpus={str(i): c for i, c in enumerate(task.corpus)},
        relevant_docs={str(i): {str(d) for d in rel} for i, rel in enumerate(task.relevant)},
        mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[1, 5, 10], map_at_k=[10], name="dev")
    expected = evaluator(model)
    embed = bertforge.pipeline("embed", model=trained)
    ours = retrieval_metrics(torch.from_numpy(embed(task.queries)), torch.from_numpy(embed(task.corpus)), task.relevant)
    for name, value in ours.items():
        assert abs(value - expected[f"dev_cosine_{name}"]) < 1e-6, name


def test_scored_pairs_cosent_and_cosine_with_matryoshka_and_caching(tiny, tmp_path, capsys):
    rng = random.Random(1)
    rows = [(f"{A[i]} is here", f"the {B[PERMUTATION[i] if k else rng.randrange(N)]} now", rng.choice([4, 5]) if k else rng.choice([0, 1]))
            for i in range(N) for k in (0, 1)]
    train = write_tsv(tmp_path / "sts.tsv", rows, "sentence1\tsentence2\tscore")
    dev = write_tsv(tmp_path / "sts_dev.tsv", rows[::3])
    out = tmp_path / "sts_out"
    for loss in ("cosent", "cosine"):
        rc = main(["train-embeddings", "--model", str(tiny), "--train", str(train), "--dev", str(dev), "--out", str(out),
                   "--loss", loss, "--score-max", "5", "--matryoshka-dims", "32,16", "--mini-batch-size", "12",
                   "--scale", "10", "--batch-size", "16", "--epochs", "2", "--lr", "1e-3", "--no-progress",
                   "--overwrite"])
        assert rc == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["shape"] == "scored" and summary["loss"] == loss and summary["main_metric"] == "spearman"
        assert set(summary["best"]["metrics"]) == {"spearman", "pearson"}


def test_triplets_symmetric_cls_unnormalized_round_trip(tiny, tmp_path):
    rows = [(a, p, n) for (a, p), (_, n) in zip(pairs(TRAIN_TEMPLATES)[:32], pairs(TRAIN_TEMPLATES)[32:64])]
    train = tmp_path / "triplets.jsonl"
    train.write_text("".join(json.dumps({"anchor": a, "positive": p, "negative": n}) + "\n" for a, p, n in rows))
    out = tmp_path / "cls_out"
    assert main(["train-embeddings", "--model", str(tiny), "--train", str(train), "--out", str(out), "--symmetric",
                 "--pooling", "cls", "--no-normalize", "--batch-size", "8", "--no-progress"]) == 0
    summary = json.loads((out / "eval.json").read_text())
    assert summary["shape"] == "triplets" and summary["before"] is None and summary["best"] is None
    assert summary["train_steps"] == 4
    types = [m["type"].rsplit(".", 1)[1] for m in json.loads((out / "modules.json").read_text())]
    assert types == ["Transformer", "Pooling"] and not (out / "2_Normalize").exists()
    texts = ["the a1 is here", "b3 there", "see"]
    reference = st.SentenceTransformer(str(out), device="cpu").encode(texts)
    ours = bertforge.pipeline("embed", model=out)(texts)
    assert np.abs(reference - ours).max() <= 1e-5
    assert not np.allclose(np.linalg.norm(ours, axis=1), 1.0)


def test_out_is_not_replaced_without_overwrite(trained, tiny, toy, capsys):
    rc = main(["train-embeddings", "--model", str(tiny), "--train", str(toy[0]), "--out", str(trained), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "--overwrite" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------------- data


def test_shapes_are_detected(tmp_path):
    header_pairs = read_pairs(write_tsv(tmp_path / "p.tsv", [("q one", "d one"), ("q two", "d two")], "query\tpassage"))
    assert header_pairs.shape == "pairs" and header_pairs.texts == [["q one", "q two"], ["d one", "d two"]]
    plain_pairs = read_pairs(write_tsv(tmp_path / "p2.tsv", [("hello", "world"), ("a", "b")]))
    assert plain_pairs.shape == "pairs" and plain_pairs.texts[0] == ["hello", "a"]  # no header: every row is data
    (tmp_path / "s.csv").write_text("a b,c d,3.5\ne,f,0\n")
    scored = read_pairs(tmp_path / "s.csv")  # no header: the last column is a number on every row
    assert scored.shape == "scored" and scored.scores == [3.5, 0.0]
    (tmp_path / "t.csv").write_text('anchor,positive,negative_1,negative_2\n"a, quoted",b,c,d\n')
    triplets = read_pairs(tmp_path / "t.csv")
    assert triplets.shape == "triplets" and triplets.texts == [["a, quoted"], ["b"], ["c"], ["d"]]
    (tmp_path / "s.jsonl").write_text('{"sentence1": "x", "sentence2": "y", "label": 0.5}\n\n{"sentence1": "z", "sentence2": "w", "label": 1}\n')
    jsonl = read_pairs(tmp_path / "s.jsonl")
    assert jsonl.shape == "scored" and jsonl.scores == [0.5, 1.0] and jsonl.lines == [1, 3]


def test_score_scale(tmp_path):
    def scores(values, score_max=None):
        data = read_pairs(write_tsv(tmp_path / "s.tsv", [(f"a{i}", "b", v) for i, v in enumerate(values)], "a\tb\tscore"))
        return normalized_scores(data, score_max)

    assert scores([0.0, 0.5, 1.0]) == [0.0, 0.5, 1.0]
    assert scores([-1.0, 0.25]) == [-1.0, 0.25]
    assert scores([0.0, 2.5, 5.0]) == [0.0, 0.5, 1.0]  # STS: divided by 5
    assert scores([0, 50, 100], score_max=100) == [0.0, 0.5, 1.0]
    with pytest.raises(BertforgeError, match="--score-max"):
        scores([0, 7])
    with pytest.raises(BertforgeError, match="beyond --score-max 4"):
        scores([0, 5], score_max=4)


def test_distinct_batches_never_repeat_a_text():
    keys = [{0, 1}, {2, 1}, {3, 4}, {5, 6}, {0, 7}, {8, 9}, {1, 10}]  # text 1 in three examples, text 0 in two
    batches = distinct_batches(list(range(7)), keys, 3)
    assert sorted(i for b in batches for i in b) == list(range(7))
    for batch in batches:
        texts = [t for i in batch for t in keys[i]]
        assert len(texts) == len(set(texts))
    assert batches[0] == [0, 2, 3]


BAD_FILES = [
    ("one.tsv", "only one column\nanother\n", "need at least two texts"),
    ("ragged.tsv", "a\tb\nc\td\ne\n", "ragged.tsv:3: 1 field"),
    ("empty_text.tsv", "anchor\tpositive\nx\ty\n \tz\n", "empty_text.tsv:3: anchor is empty"),
    ("bad_score.tsv", "sentence1\tsentence2\tscore\nx\ty\t0.5\nx\ty\thigh\n", "bad_score.tsv:3: the score 'high' is not a number"),
    ("three_scored.tsv", "a\tb\tc\tscore\nx\ty\tz\t1\n", "a scored file holds two texts and a score"),
    ("keys.jsonl", '{"anchor": "x", "positive": "y"}\n{"anchor": "x", "pos": "y"}\n', "keys.jsonl:2: keys"),
    ("not_text.jsonl", '{"anchor": "x", "positive": 3}\n', "not_text.jsonl:1: positive is not a text"),
    ("broken.jsonl", '{"anchor": "x", "positive": "y"}\n{"anchor": \n', "broken.jsonl:2"),
    ("blank.tsv", "\n\n", "the file is empty"),
]


@pytest.mark.parametrize("name, content, message", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_files_are_refused_naming_the_line(tiny, tmp_path, capsys, name, content, message):
    (tmp_path / name).write_text(content, encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["train-embeddings", "--model", str(tiny), "--train", str(tmp_path / name), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--loss", "mnrl"], "--loss mnrl needs pairs or triplets; this file holds scored"),
    (["--symmetric"], "--symmetric applies to --loss mnrl, not cosent"),
    (["--matryoshka-dims", "64,32"], "--matryoshka-dims 64 is larger than the embedding (32)"),
    (["--matryoshka-dims", "32,x"], "--matryoshka-dims must be integers"),
    (["--max-length", "999"], "beyond this model's 64 positions"),
    (["--mini-batch-size", "0"], "mini_batch_size must be an integer >= 1"),
])
def test_bad_settings_are_refused(tiny, tmp_path, capsys, args, message):
    train = write_tsv(tmp_path / "sts.tsv", [("a", "b", 1), ("c", "d", 0)], "sentence1\tsentence2\tscore")
    rc = main(["train-embeddings", "--model", str(tiny), "--train", str(train), "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err


def test_unknown_precision_is_refused_by_the_parser(tiny, tmp_path, capsys):
    train = write_tsv(tmp_path / "sts.tsv", [("a", "b", 1), ("c", "d", 0)], "sentence1\tsentence2\tscore")
    with pytest.raises(SystemExit) as exit_:
        main(["train-embeddings", "--model", str(tiny), "--train", str(train), "--out", str(tmp_path / "o"),
              "--precision", "fp8"])
    assert exit_.value.code == 2 and "invalid choice: 'fp8'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_schedule_spans_the_batches_without_repeated_texts(tiny, tmp_path):
    """12 questions sharing 2 passages: batches of 4 without a repeated passage hold 2 examples, so an epoch has 6
    steps, not 3, and the learning rate must not reach 0 before the last of them."""
    data_file = write_tsv(tmp_path / "shared.tsv", [(f"{A[i]} now", f"see {B[i % 2]}") for i in range(12)])
    run = _training(tiny, data_file, batch_size=4, epochs=2, warmup_ratio=0.0)
    assert [len(b) for epoch in run.plan for b in epoch] == [2] * 12
    assert run.total_steps == 12
    factor = run.stepper.scheduler.lr_lambdas[0]
    assert factor(11) > 0 and factor(12) == 0
