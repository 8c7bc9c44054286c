"""ModernBERT, DeBERTa-v3, MPNet, NomicBERT, GTE, EuroBERT, jina-v3, ELECTRA: bertforge against transformers in the same run, same weights,
same batches.

Pure measurement: prints a table with each target beside its ratio, never asserts.

  (a) train: one masked-LM training step (forward, loss, backward, AdamW step, zero_grad; train mode, fp32) at the
      presets' mini (4 x 256) and base sizes (ModernBERT 22 x 768, DeBERTa-v3 12 x 768), on batches of mixed
      lengths padded to their longest, 15 % of the real tokens labelled. Targets: ModernBERT >= 2x mini, >= 1.3x
      base; DeBERTa-v3 >= 2x mini, >= 1.5x base; MPNet, NomicBERT, GTE, ELECTRA >= 2x mini.
  (b) embed: sentence embeddings (mean pooling) of texts of mixed lengths: `bertforge.pipeline("embed")` against the
      plain transformers loop (its tokenizer, batches of 32 in file order padded to their longest, masked mean,
      no_grad). Targets: ModernBERT >= 2x, DeBERTa >= 2.5x, MPNet, NomicBERT, GTE, ELECTRA >= 2x.
  (c) long: ModernBERT (mini) at 512, 2,048 and 8,192 tokens, one sequence: tokens/s and peak memory of a training
      step and of an embedding forward. Memory is the growth of the resident set's high-water mark (VmHWM, reset
      through /proc/self/clear_refs) during the first call over the RSS just before it (model loaded, optimizer
      made: the call's activations, gradients and optimizer states), in a fresh subprocess per case
      (implementation x mode x length); time is the median of the calls after it. Target at 8,192: >= 2x
      faster, < half the peak memory.

Both models load one checkpoint that transformers wrote (bertforge reads it with from_pretrained); both use
`bertforge.training.optim.make_optimizer(model, "adamw", ...)` (fused AdamW); transformers runs its SDPA attention
(DeBERTa and MPNet have only their eager one). The implementations are interleaved round by round (the order flips each
round); times are medians and each ratio is the median of the per-round ratios, which holds up when other load on
the machine drifts. On a shared machine, read the ratios, not the absolute figures.

    .venv/bin/python bench/family_speed.py --quick                 # a few minutes: small batches, few rounds
    .venv/bin/python bench/family_speed.py --parts train --sizes mini --rounds 7
    .venv/bin/python bench/family_speed.py --parts long --lengths 512,2048,8192
    .venv/bin/python bench/family_speed.py --families mpnet,nomic,gte,eurobert,jina --parts train,embed --sizes mini --embed-size mini
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bertforge  # noqa: E402
from bertforge.model.config import BertConfig  # noqa: E402
from bertforge.training.optim import make_optimizer  # noqa: E402

FAMILIES = {"modernbert": ("modernbert", "ModernBert"), "deberta": ("deberta-v2", "DebertaV2"),
            "mpnet": ("mpnet", "MPNet"), "nomic": ("nomic_bert", "NomicBert"), "gte": ("gte", "Gte"),
            "eurobert": ("eurobert", "EuroBert"), "jina": ("jina_embeddings_v3", "JinaEmbeddingsV3"),
            "electra": ("electra", "Electra")}
TARGETS = {("modernbert", "train", "mini"): 2.0, ("modernbert", "train", "base"): 1.3,
           ("deberta", "train", "mini"): 2.0, ("deberta", "train", "base"): 1.5,
           ("modernbert", "embed"): 2.0, ("deberta", "embed"): 2.5,
           **{(f, "train", "mini"): 2.0 for f in ("mpnet", "nomic", "gte", "eurobert", "jina", "electra")},
           **{(f, "embed"): 2.0 for f in ("mpnet", "nomic", "gte", "eurobert", "jina", "electra")}}
#: the tokenizer kind each family's checkpoints ship (DeBERTa's is built below from transformers' own class)
KINDS = {"modernbert": "modernbert", "mpnet": "mpnet", "nomic": "bert", "gte": "bert", "eurobert": "eurobert", "jina": "xlm-roberta",
         "electra": "bert"}
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
LR, WD = 1e-4, 0.01


# ---------------------------------------------------------------------------------------------------- checkpoints


def words(n: int = 400) -> list[str]:
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return sorted({"".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(n)})


def texts(n: int, shortest: int, longest: int, seed: int = 1) -> list[str]:
    rng, vocab = random.Random(seed), words()
    return [" ".join(rng.choice(vocab) for _ in range(rng.randint(shortest, longest))) + " ." for _ in range(n)]


def save_tokenizer(family: str, directory: Path) -> int:
    """The family's kind of tokenizer over `words()` into `directory`; returns its vocabulary size."""
    import transformers

    if family in KINDS:
        from bertforge.tokenizer import Tokenizer

        tokenizer = Tokenizer.train(iter(texts(400, 5, 40)), vocab_size=2000, kind=KINDS[family], show_progress=False)
        tokenizer.model_max_length = 8192  # modernbert-base's tokenizer_config.json says 8192
        tokenizer.save_pretrained(directory)
        return tokenizer.vocab_size
    vocab = [(s, 0.0) for s in SPECIALS] + [("▁" + w, -3.0) for w in words()] + [("▁", -5.0)]
    vocab += [(c, -8.0) for c in "abcdefghijklmnopqrstuvwxyz.,"]
    transformers.DebertaV2Tokenizer(vocab=vocab, unk_id=3).save_pretrained(directory)
    return len(vocab)


def save_checkpoint(family: str, size: str, directory: Path, head: bool = True, **overrides) -> Path:
    """A random `transformers` model of the bertforge preset FAMILY-SIZE (MLM head or bare), with its tokenizer."""
    import transformers

    member, prefix = FAMILIES[family]
    vocab = save_tokenizer(family, directory)
    pad = 1 if family == "mpnet" else 0  # MPNet's tokenizer's (its positions count after it)
    config = BertConfig.preset(f"{member}-{size}", vocab_size=vocab if not head else 30522, pad_token_id=pad,
                               **overrides)
    torch.manual_seed(0)
    bertforge.AutoModel.from_config(config).save_pretrained(directory)  # config.json as bertforge writes it
    hf_config = transformers.AutoConfig.from_pretrained(directory)
    model = getattr(transformers, prefix + ("ForMaskedLM" if head else "Model"))(hf_config)
    model.save_pretrained(directory)
    return directory


def load_pair(directory: Path, head: bool):
    import transformers

    hf_class = transformers.AutoModelForMaskedLM if head else transformers.AutoModel
    ours_class = bertforge.AutoModelForMaskedLM if head else bertforge.AutoModel
    theirs = hf_class.from_pretrained(directory, attn_implementation="sdpa") if "modernbert" in str(directory) \
        else hf_class.from_pretrained(directory)
    return ours_class.from_pretrained(directory), theirs


# ---------------------------------------------------------------------------------------------------- (a) train


def mlm_batches(n: int, batch: int, seq: int, vocab: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Rows of lengths drawn from [seq / 4, seq], padded to the batch's longest; 15 % of real tokens labelled."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(seq // 4, seq + 1, (batch,), generator=g)
        width = int(lengths.max())
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        ids = torch.randint(10, vocab, (batch, width), generator=g) * mask
        ids[:, 0] = 1
        labels = torch.full_like(ids, -100)
        picked = (torch.rand(batch, width, generator=g) < 0.15) & mask.bool()
        picked[:, 0] = False
        labels[picked] = ids[picked]
        ids = ids.masked_fill(picked, 4)
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def train_step(model, optimizer, batch) -> None:
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


#: The clock `timed` reads: wall time, or (--clock cpu) this process's CPU time, which a loaded machine disturbs
#: less (with --threads 1 it is the work done; with more threads it adds up every thread's, spinning included).
CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter


def timed(fn) -> float:
    start = clock()
    fn()
    return clock() - start


def interleaved(runs: dict[str, callable], rounds: int, warmup: int) -> dict[str, list[float]]:
    """Each of `runs` `warmup` times, then `rounds` rounds of one call each (the order flipping every round)."""
    for fn in runs.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(timed(runs[name]))
    return times


def ratio(times: dict[str, list[float]]) -> float:
    """The median over rounds of transformers' time / bertforge's."""
    return statistics.median(h / b for b, h in zip(times["bertforge"], times["transformers"]))


def bench_train(family: str, size: str, args, root: Path) -> dict:
    directory = save_checkpoint(family, size, root / f"{family}-{size}-mlm")
    ours, theirs = load_pair(directory, head=True)
    batch = args.batch if size == "mini" else max(1, args.batch // 2)
    batches = mlm_batches(4, batch, args.seq, ours.config.vocab_size)
    tokens = statistics.mean(int(b["attention_mask"].sum()) for b in batches)
    runs = {}
    for name, model in (("bertforge", ours), ("transformers", theirs)):
        model.train()
        optimizer = make_optimizer(model, "adamw", LR, WD)
        cycle = iter(range(10**9))
        runs[name] = (lambda m=model, o=optimizer, c=cycle: train_step(m, o, batches[next(c) % len(batches)]))
    times = interleaved(runs, args.rounds, args.warmup)
    return {"part": "train", "family": family, "size": size, "batch": f"{batch} x <={args.seq}",
            "ours_s": statistics.median(times["bertforge"]), "theirs_s": statistics.median(times["transformers"]),
            "tokens": tokens, "ratio": ratio(times), "target": TARGETS.get((family, "train", size))}


# ---------------------------------------------------------------------------------------------------- (b) embed


def transformers_embed(model, tokenizer, sentences: list[str], batch: int = 32, max_length: int = 512):
    """The loop most users write: batches in file order, padded to their longest, masked mean pooling."""
    out = []
    with torch.no_grad():
        for i in range(0, len(sentences), batch):
            enc = tokenizer(sentences[i : i + batch], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out.append((hidden * mask).sum(1) / mask.sum(1))
    return torch.cat(out)


def bench_embed(family: str, size: str, args, root: Path) -> dict:
    import transformers

    directory = save_checkpoint(family, size, root / f"{family}-{size}-bare", head=False)
    _, theirs = load_pair(directory, head=False)
    theirs.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    pipe = bertforge.pipeline("embed", model=directory, pooling="mean", normalize=False, max_length=512)
    sentences = texts(args.sentences, 3, 300, seed=2)
    ours_vectors = torch.as_tensor(pipe(sentences))
    theirs_vectors = transformers_embed(theirs, tokenizer, sentences)
    cosine = float(torch.nn.functional.cosine_similarity(ours_vectors, theirs_vectors).min())
    runs = {"bertforge": lambda: pipe(sentences), "transformers": lambda: transformers_embed(theirs, tokenizer, sentences)}
    times = interleaved(runs, args.rounds, 0)
    tokens = sum(len(ids) for ids in tokenizer(sentences, truncation=True, max_length=512)["input_ids"])
    return {"part": "embed", "family": family, "size": size, "batch": f"{len(sentences)} texts",
            "ours_s": statistics.median(times["bertforge"]), "theirs_s": statistics.median(times["transformers"]),
            "tokens": tokens, "ratio": ratio(times), "target": TARGETS.get((family, "embed")),
            "note": f"min cosine {cosine:.6f}"}


# ---------------------------------------------------------------------------------------------------- (c) long


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def long_case(directory: str, impl: str, mode: str, length: int, repeats: int) -> dict:
    """One case in this (fresh) process: seconds per call (median) and the peak RSS growth of one measured call."""
    from bertforge.core.system import reuse_freed_memory

    reuse_freed_memory()  # as bertforge's commands run on CPU (kept memory: the peak, not page faults, is counted)
    ours, theirs = load_pair(Path(directory), head=(mode == "train"))
    model = ours if impl == "bertforge" else theirs
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 2000, (1, length), generator=g)
    if mode == "train":
        model.train()
        optimizer = make_optimizer(model, "adamw", LR, WD)
        labels = torch.where(torch.rand(1, length, generator=g) < 0.15, ids, torch.full_like(ids, -100))
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
        call = lambda: train_step(model, optimizer, batch)  # noqa: E731
    else:
        model.eval()
        if impl == "bertforge":
            pipe = bertforge.pipeline("embed", model=directory, pooling="mean", normalize=False, max_length=length)
            vocab = words()
            text = " ".join(vocab[i % len(vocab)] for i in range(length))  # length tokens or more: cut to length
            call = lambda: pipe([text])  # noqa: E731
        else:
            import transformers

            tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
            vocab = words()
            text = " ".join(vocab[i % len(vocab)] for i in range(length))
            call = lambda: transformers_embed(model, tokenizer, [text], max_length=length)  # noqa: E731
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = _rss_kb("VmRSS")
    call()  # the first call: its peak (activations, gradients, optimizer states) is the one measured; it warms up
    peak = (_rss_kb("VmHWM") - before) / 1024
    seconds = [timed(call) for _ in range(repeats)]
    return {"seconds": statistics.median(seconds), "peak_mib": peak}


def bench_long(args, root: Path) -> list[dict]:
    directory = save_checkpoint("modernbert", "mini", root / "modernbert-long", head=True, max_position_embeddings=8192)
    rows = []
    for mode in args.long_modes.split(","):
        for length in args.lengths:
            found: dict[str, dict] = {}
            for impl in (("bertforge", "transformers") if length % 2 == 0 else ("transformers", "bertforge")):
                cmd = [sys.executable, __file__, "--clock", args.clock, "--case",
                       json.dumps([str(directory), impl, mode, length, args.long_repeats])]
                cmd += ["--threads", str(args.threads)] if args.threads else []
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
                if done.returncode != 0:
                    found[impl] = {"seconds": float("nan"), "peak_mib": float("nan"), "error": done.stderr[-300:]}
                    print(f"  {impl} {mode} {length}: failed: {done.stderr[-300:]}", file=sys.stderr)
                else:
                    found[impl] = json.loads(done.stdout.strip().splitlines()[-1])
            b, h = found["bertforge"], found["transformers"]
            rows.append({"part": f"long {mode}", "family": "modernbert", "size": "mini", "batch": f"1 x {length}",
                         "ours_s": b["seconds"], "theirs_s": h["seconds"], "tokens": length,
                         "ratio": h["seconds"] / b["seconds"], "target": 2.0 if length == 8192 else None,
                         "note": f"peak MiB {b['peak_mib']:.0f} vs {h['peak_mib']:.0f} "
                                 f"({b['peak_mib'] / max(h['peak_mib'], 1e-9):.2f}x{', target < 0.5x' if length == 8192 else ''})"})
            print(row_text(rows[-1]), flush=True)
    return rows


# ---------------------------------------------------------------------------------------------------- report


HEADER = (f"| {'part':<11} | {'family':<10} | {'size':<4} | {'batch':<13} | {'ours s':>8} | {'HF s':>8} | "
          f"{'ours tok/s':>10} | {'HF tok/s':>9} | {'x HF':>5} | {'target':>6} | note")


def row_text(r: dict) -> str:
    target = f">={r['target']:.1f}x" if r.get("target") else ""
    met = "" if not r.get("target") else (" ok" if r["ratio"] >= r["target"] else " MISSED")
    return (f"| {r['part']:<11} | {r['family']:<10} | {r['size']:<4} | {r['batch']:<13} | {r['ours_s']:8.3f} | "
            f"{r['theirs_s']:8.3f} | {r['tokens'] / r['ours_s']:10.0f} | {r['tokens'] / r['theirs_s']:9.0f} | "
            f"{r['ratio']:5.2f} | {target:>6} | {r.get('note', '')}{met}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="modernbert,deberta")
    parser.add_argument("--sizes", default="mini,base")
    parser.add_argument("--parts", default="train,embed,long")
    parser.add_argument("--rounds", type=int, default=7, help="measured rounds (medians over them)")
    parser.add_argument("--warmup", type=int, default=2, help="training steps of each before measuring")
    parser.add_argument("--batch", type=int, default=16, help="rows per training batch at mini (half at base)")
    parser.add_argument("--seq", type=int, default=128, help="longest row of a training batch")
    parser.add_argument("--sentences", type=int, default=1000, help="texts embedded per round")
    parser.add_argument("--lengths", default="512,2048,8192", help="long-context lengths (ModernBERT)")
    parser.add_argument("--long-modes", default="train,embed", help="long-context cases: a training step, embedding")
    parser.add_argument("--long-repeats", type=int, default=3, help="measured calls per long-context case")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's; the subprocesses too)")
    parser.add_argument("--clock", choices=list(CLOCK), default="wall", help="wall time, or this process's CPU time")
    parser.add_argument("--quick", action="store_true", help="mini sizes only, batches of 8, 3 rounds, 200 texts, one "
                        "long-context call per case")
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)  # one long-context case (a subprocess)
    parser.add_argument("--embed-size", default="base", help="the preset size of the embedding comparison")
    if "--quick" in sys.argv:  # quick defaults; options given explicitly still win
        parser.set_defaults(rounds=3, warmup=1, batch=8, sentences=200, long_repeats=1, sizes="mini", embed_size="mini")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    global clock
    clock = CLOCK[args.clock]
    if args.case:
        print(json.dumps(long_case(*json.loads(args.case))))
        return
    args.lengths = [int(x) for x in args.lengths.split(",")]
    parts, sizes = args.parts.split(","), args.sizes.split(",")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} clock, rounds {args.rounds}, "
          f"fp32 CPU", flush=True)
    print(HEADER, flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for family in args.families.split(","):
            for size in sizes if "train" in parts else []:
                rows.append(bench_train(family, size, args, root))
                print(row_text(rows[-1]), flush=True)
            if "embed" in parts:
                rows.append(bench_embed(family, args.embed_size, args, root))
                print(row_text(rows[-1]), flush=True)
        if "long" in parts:
            rows += bench_long(args, root)
    print("\n" + HEADER)
    for r in rows:
        print(row_text(r))


if __name__ == "__main__":
    main()
