"""Is replaced-token detection worth it on a small budget? DeBERTa-v3's RTD against MLM at the same model size and
the same CPU seconds of pretraining, each model then fine-tuned the same way on SST-2 and CoLA (issue #31, item 4).
Method, data and choices: bench/README.md; the write-up: docs/benchmarks/rtd-vs-mlm.md.

    .venv/bin/python bench/rtd_vs_mlm.py --cpu-minutes 60                  # the study (about 2 hours on 2 cores)
    .venv/bin/python bench/rtd_vs_mlm.py --cpu-minutes 1 --seeds 1 --sst2-rows 400 --cola-rows 400 \
        --eval-instances 64 --work /tmp/rtd_smoke                          # smoke run of the whole script

Three pretrainings, each with one thread (OMP_NUM_THREADS=1) and run at the same time: `rtd` (`--config
deberta-v3-SIZE --objective rtd`: the discriminator is the model), `mlm` (the same DeBERTa-v3 architecture,
`--objective mlm`: bertforge's MLM, 15 % with 80/10/10) and `bert` (BERT's preset of that size, its default recipe:
MLM + NSP). A short calibration run of each gives its CPU seconds per step; `--max-steps` is set so that each gets
--cpu-minutes of training CPU. CPU time is read from /proc (the curve) and from wait4's rusage (the total).

Writes WORK/results.json, WORK/results.md (the tables) and WORK/curves.png (pretraining losses against CPU seconds,
the fine-tuned scores). Needs /work/shared/data (or $BERTFORGE_DATA). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

DATA = Path(os.environ.get("BERTFORGE_DATA", "/work/shared/data"))
CORPORA = DATA / "corpora"
TASKS = DATA / "tasks"
# Held out by whole books, as in pretrain_quality.py: one book of each of three authors the training text also has.
HELD_OUT = ("austen-persuasion.txt", "chesterton-brown.txt", "shakespeare-macbeth.txt")
RUNS = ("rtd", "mlm", "bert")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu-minutes", type=float, required=True, help="training CPU minutes of each pretraining")
    p.add_argument("--work", type=Path, default=Path("runs/rtd_vs_mlm"), help="working directory")
    p.add_argument("--size", default="tiny", help="model size: a generic preset (tiny, mini, ...) of both families")
    p.add_argument("--runs", default=",".join(RUNS), help="which pretrainings (rtd, mlm, bert)")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-4, help="peak learning rate of every pretraining")
    p.add_argument("--warmup-ratio", type=float, default=0.06)
    p.add_argument("--vocab-size", type=int, default=8000, help="the shared WordPiece vocabulary")
    p.add_argument("--calibration-steps", type=int, default=30, help="steps of each calibration run")
    p.add_argument("--cpu-per-step", default=None,
                   help="RUN=SECONDS,...: CPU seconds a step measured by an earlier calibration of the same settings "
                        "(its lines 'calibration RUN: S CPU s a step'); the calibration runs are then skipped")
    p.add_argument("--evals", type=int, default=6, help="held-out evaluations per pretraining (and at step 0)")
    p.add_argument("--eval-instances", type=int, default=256, help="held-out sequences (fixed masks)")
    p.add_argument("--seeds", type=int, default=2, help="fine-tuning seeds per model and task")
    p.add_argument("--sst2-rows", type=int, default=4000, help="SST-2 training rows")
    p.add_argument("--cola-rows", type=int, default=8551, help="CoLA training rows (in_domain_train.tsv has 8,551)")
    p.add_argument("--ft-epochs", type=int, default=3)
    p.add_argument("--ft-lr", type=float, default=2e-4)
    p.add_argument("--ft-batch-size", type=int, default=32)
    p.add_argument("--parallel", type=int, default=2, help="fine-tuning runs at the same time")
    p.add_argument("--no-scratch", dest="scratch", action="store_false",
                   help="leave out the floor: the DeBERTa-v3 model never pretrained, fine-tuned the same way")
    p.add_argument("--previous", type=Path, default=None,
                   help="an earlier run's results.json: its pretrainings and fine-tunings are kept, only the "
                        "fine-tunings it lacks run (the scratch model's, more seeds)")
    a = p.parse_args()
    a.runs = [r for r in a.runs.split(",") if r]
    try:
        a.cpu_per_step = a.cpu_per_step and {k: float(v) for k, v in (x.split("=") for x in a.cpu_per_step.split(","))}
    except ValueError:
        p.error("--cpu-per-step: RUN=SECONDS,... (rtd=0.24,mlm=0.13,bert=0.09)")
    if a.cpu_per_step and not set(a.runs) <= set(a.cpu_per_step):
        p.error(f"--cpu-per-step: give every run of --runs ({', '.join(a.runs)})")
    if not set(a.runs) <= set(RUNS) or not 0 < a.cpu_minutes < float("inf"):
        p.error(f"--runs: choose from {', '.join(RUNS)}; --cpu-minutes: a positive number")
    return a


def corpus_files() -> tuple[list[str], list[str]]:
    """(training files, held-out files): wikitext-2's valid.txt and the Gutenberg books less HELD_OUT; HELD_OUT.
    chesterton-ball.txt and shakespeare-caesar.txt are latin-1: bertforge reads their 7 non-UTF-8 bytes as U+FFFD."""
    books = CORPORA / "gutenberg"
    if not books.is_dir():
        raise SystemExit(f"{books} not found: set BERTFORGE_DATA to the shared data directory")
    train = sorted(str(p) for p in books.glob("*.txt") if p.name not in HELD_OUT)
    return train + [str(CORPORA / "wikitext2" / "valid.txt")], [str(books / name) for name in HELD_OUT]


def bertforge(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertforge", *args]


def child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system, all threads) of a running process, from /proc; None once it has gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Tracked:
    """A subprocess whose CPU seconds are sampled while it runs: each new row of `metrics` (a metrics.jsonl) gets
    the CPU seconds the process had used when the row appeared (polled every 0.5 s); when it exits, its whole CPU
    time (its children's included) is read from wait4's rusage and its wall time taken."""

    def __init__(self, cmd: list[str], log: Path, metrics: Path | None = None) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log, self.metrics, self.rows, self.usage = log, metrics, [], {}
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, env=child_env(), stdout=log.open("w"), stderr=subprocess.STDOUT)
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        seen, cpu = 0, 0.0
        while True:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:  # exited: the rows it wrote last get its final CPU time
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                cpu = usage.ru_utime + usage.ru_stime
                self.usage = {"cpu_s": cpu, "wall_s": time.perf_counter() - self.started}
            else:
                cpu = process_cpu(self.proc.pid) or cpu
            if self.metrics is not None and self.metrics.is_file():
                lines = self.metrics.read_text(encoding="utf-8").splitlines()
                complete = [line for line in lines[seen:] if line.endswith("}")]
                for line in complete:
                    self.rows.append({**json.loads(line), "cpu_s": cpu, "wall_s": time.perf_counter() - self.started})
                seen += len(complete)
            if pid:
                return
            time.sleep(0.5)

    def finish(self) -> dict[str, float]:
        self.thread.join()
        if self.proc.returncode != 0:
            tail = self.log.read_text(errors="replace").splitlines()[-15:]
            raise SystemExit(f"{self.proc.args[3]} failed ({self.proc.returncode}); {self.log}:\n" + "\n".join(tail))
        return self.usage


def shared_tokenizer(a: argparse.Namespace, train: list[str]) -> Path:
    """One WordPiece vocabulary of the training files (`bertforge train-tokenizer`), given to every run."""
    path = a.work / "tokenizer"
    if not (path / "tokenizer.json").is_file():
        subprocess.run(bertforge("train-tokenizer", "--corpus", *train, "--vocab-size", str(a.vocab_size),
                                 "--out", str(path)), check=True, env=child_env())
    return path


def pretrain_cmd(a: argparse.Namespace, run: str, out: Path, steps: int, files: dict, evals: bool) -> list[str]:
    """`bertforge pretrain` of one run: every setting the same but the model family and the objective."""
    config, objective = {"rtd": (f"deberta-v3-{a.size}", "rtd"), "mlm": (f"deberta-v3-{a.size}", "mlm"),
                         "bert": (a.size, "auto")}[run]
    cmd = bertforge("pretrain", "--corpus", *files["train"], "--tokenizer", str(files["tokenizer"]),
                    "--out", str(out), "--overwrite", "--device", "cpu", "--config", config, "--objective", objective,
                    "--max-steps", str(steps), "--batch-size", str(a.batch_size), "--max-length", str(a.max_length),
                    "--lr", str(a.lr), "--warmup-ratio", str(a.warmup_ratio), "--decay", "linear", "--seed", "0",
                    "--save-every", str(10**9), "--log-every", "5" if not evals else "10", "--no-progress")
    if evals:
        cmd += ["--eval-corpus", *files["held_out"], "--eval-max-instances", str(a.eval_instances),
                "--eval-every", str(max(1, steps // a.evals))]
    return cmd


def calibrate(a: argparse.Namespace, files: dict) -> dict[str, float]:
    """CPU seconds per step of each run, all calibrated at once (as they will train): between the first and the
    last metrics row of a --calibration-steps run (start-up, the shuffle buffer and the export left out)."""
    tracked = {run: Tracked(pretrain_cmd(a, run, a.work / "calibration" / run, a.calibration_steps, files, False),
                            a.work / "logs" / f"calibration-{run}.log", a.work / "calibration" / run / "metrics.jsonl")
               for run in a.runs}
    per_step = {}
    for run, t in tracked.items():
        t.finish()
        rows = [r for r in t.rows if r.get("type", "train") == "train" and r["cpu_s"] is not None]
        first, last = rows[0], rows[-1]
        per_step[run] = (last["cpu_s"] - first["cpu_s"]) / max(1, last["step"] - first["step"])
        print(f"calibration {run}: {per_step[run]:.3f} CPU s a step (steps {first['step']}-{last['step']})",
              flush=True)
    return per_step


def pretrain_all(a: argparse.Namespace, files: dict, per_step: dict[str, float]) -> dict[str, dict]:
    """The pretrainings, at the same time, each --max-steps fitted to --cpu-minutes of training CPU."""
    tracked, results = {}, {}
    for run in a.runs:
        steps = max(10, int(60 * a.cpu_minutes / per_step[run]))
        out = a.work / "pretrain" / run
        print(f"pretrain {run}: {steps} steps", flush=True)
        tracked[run] = Tracked(pretrain_cmd(a, run, out, steps, files, True), a.work / "logs" / f"pretrain-{run}.log",
                               out / "metrics.jsonl")
        results[run] = {"max_steps": steps, "calibrated_cpu_s_per_step": per_step[run], "out": str(out)}
    for run, t in tracked.items():
        total = t.finish()
        rows = [r for r in t.rows if r["cpu_s"] is not None]
        start = next(r["cpu_s"] for r in rows if r.get("type") == "eval" and r["step"] == 0)
        last = rows[-1]
        results[run].update(total_cpu_s=total["cpu_s"], wall_s=total["wall_s"], training_cpu_s=last["cpu_s"] - start,
                            rows=[{**r, "cpu_s": r["cpu_s"] - start} for r in rows])
        results[run]["final_eval"] = [r for r in rows if r.get("type") == "eval"][-1]
        print(f"pretrain {run}: {results[run]['training_cpu_s']:.0f} training CPU s ({total['cpu_s']:.0f} in all, "
              f"{total['wall_s']:.0f} s wall)", flush=True)
    return results


def task_files(a: argparse.Namespace) -> dict[str, dict]:
    """Each task's training subset (in WORK), its selection set (dev: the best epoch's weights are kept) and the
    set it is scored on: SST-2 (first --sst2-rows of train.tsv; dev: first 500 of dev.tsv; scored on test.tsv,
    GLUE's dev, 872) and CoLA (first --cola-rows of in_domain_train.tsv; dev: out_of_domain_dev.tsv (516); scored on
    in_domain_dev.tsv (527), MCC)."""
    def head(source: Path, rows: int, header: bool, name: str) -> str:
        lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
        path = a.work / "tasks" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(lines[: rows + header]), encoding="utf-8")
        return str(path)

    sst2, cola = TASKS / "sst2", TASKS / "cola" / "raw"
    cola_columns = ["--no-header", "--text-column", "3", "--label-column", "1"]
    return {
        "sst2": {"train": head(sst2 / "train.tsv", a.sst2_rows, True, f"sst2-train-{a.sst2_rows}.tsv"),
                 "dev": head(sst2 / "dev.tsv", 500, True, "sst2-dev-500.tsv"), "test": str(sst2 / "test.tsv"),
                 "options": [], "metric": "accuracy", "eval": {}},
        "cola": {"train": head(cola / "in_domain_train.tsv", a.cola_rows, False, f"cola-train-{a.cola_rows}.tsv"),
                 "dev": str(cola / "out_of_domain_dev.tsv"), "test": str(cola / "in_domain_dev.tsv"),
                 "options": [*cola_columns, "--metric", "mcc"], "metric": "mcc",
                 "eval": dict(no_header=True, text_column="3", label_column="1")},
    }


def finetune_all(a: argparse.Namespace, models: dict[str, str], done: list[dict]) -> list[dict]:
    """Every model x task x seed not in `done` fine-tuned with the one recipe (`bertforge finetune`), --parallel at
    a time, then scored on the task's held-out set; `done` and these."""
    from bertforge.finetune import evaluate

    tasks = task_files(a)
    have = {(r["model"], r["task"], r["seed"]) for r in done}
    jobs = [(name, task, seed) for task in tasks for seed in range(1, a.seeds + 1) for name in models
            if (name, task, seed) not in have]
    running, results = [], list(done)

    def collect(job, tracked, out):
        name, task, seed = job
        usage = tracked.finish()
        spec = tasks[task]
        scores = evaluate("classification", out / "model", spec["test"], device="cpu", max_length=64, **spec["eval"])
        results.append({"model": name, "task": task, "seed": seed, "metric": spec["metric"],
                        "score": scores[spec["metric"]], **{k: scores[k] for k in ("accuracy", "mcc")}, **usage})
        print(f"finetune {name} {task} seed {seed}: {spec['metric']} {scores[spec['metric']]:.4f} "
              f"({usage['cpu_s']:.0f} CPU s)", flush=True)

    for job in jobs:
        if len(running) >= a.parallel:
            collect(*running.pop(0))
        name, task, seed = job
        spec, out = tasks[task], a.work / "finetune" / f"{name}-{task}-{seed}"
        cmd = bertforge("finetune", "--task", "classification", "--model", models[name], "--train", spec["train"],
                        "--dev", spec["dev"], "--out", str(out), "--overwrite", "--epochs", str(a.ft_epochs),
                        "--batch-size", str(a.ft_batch_size), "--lr", str(a.ft_lr), "--warmup-ratio", "0.1",
                        "--max-length", "64", "--seed", str(seed), "--device", "cpu", "--no-progress",
                        *spec["options"])
        running.append((job, Tracked(cmd, a.work / "logs" / f"finetune-{name}-{task}-{seed}.log"), out))
    for item in running:
        collect(*item)
    return results


def scratch_model(a: argparse.Namespace, like: Path) -> str:
    """The floor pretraining has to beat: a model of `like`'s config (the MLM run's) never pretrained, its weights
    drawn by the family's init (seed 0), with `like`'s tokenizer files."""
    import shutil

    import torch

    from bertforge.model import BertConfig, BertModel

    out = a.work / "scratch" / "model"
    torch.manual_seed(0)
    BertModel(BertConfig.from_pretrained(like)).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (like / name).is_file():
            shutil.copy(like / name, out / name)
    return str(out)


def summary(finetuned: list[dict]) -> dict[tuple[str, str], tuple[float, float, int]]:
    """(model, task) -> (mean, spread (max - min), seeds) of the held-out score."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in finetuned:
        groups.setdefault((r["model"], r["task"]), []).append(r["score"])
    return {k: (sum(v) / len(v), max(v) - min(v), len(v)) for k, v in groups.items()}


def tables(a: argparse.Namespace, pretrained: dict, finetuned: list[dict]) -> str:
    lines = ["| run | model | steps | training CPU s | all CPU s | wall s | held-out MLM loss | MLM acc. | "
             "RTD acc. (all-original) | RTD F1 |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run, r in pretrained.items():
        e = r["final_eval"]
        rtd = (f"{e['eval_rtd_accuracy']:.3f} ({e['eval_rtd_all_original']:.3f}) | {e['eval_rtd_f1']:.3f}"
               if "eval_rtd_f1" in e else "- | -")
        mlm_loss = e.get("eval_mlm_loss", e["eval_loss"])
        lines.append(f"| {run} | {model_name(a, run)} | {r['max_steps']} | {r['training_cpu_s']:.0f} | "
                     f"{r['total_cpu_s']:.0f} | {r['wall_s']:.0f} | {mlm_loss:.3f} | {e['eval_mlm_accuracy']:.3f} | "
                     f"{rtd} |")
    scores = summary(finetuned)
    tasks = sorted({t for _, t in scores}, reverse=True)
    lines += ["", "| model | " + " | ".join(f"{t} ({'MCC' if t == 'cola' else 'accuracy'})" for t in tasks) + " |",
              "| --- |" + " ---: |" * len(tasks)]
    for run in [*pretrained, *(["scratch"] if a.scratch else [])]:
        cells = [f"{scores[run, t][0]:.3f} ± {scores[run, t][1] / 2:.3f} (n={scores[run, t][2]})"
                 if (run, t) in scores else "-" for t in tasks]
        lines.append(f"| {run} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def model_name(a: argparse.Namespace, run: str) -> str:
    return {"rtd": f"deberta-v3-{a.size}, RTD (discriminator)", "mlm": f"deberta-v3-{a.size}, MLM",
            "bert": f"BERT {a.size}, MLM + NSP", "scratch": f"deberta-v3-{a.size}, not pretrained"}[run]


def plot(a: argparse.Namespace, pretrained: dict, finetuned: list[dict], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4))
    for run, r in pretrained.items():
        train = [x for x in r["rows"] if x.get("type", "train") == "train"]
        evals = [x for x in r["rows"] if x.get("type") == "eval"]
        label = {"rtd": "RTD generator", "mlm": "MLM (DeBERTa-v3)", "bert": "BERT MLM + NSP"}[run]
        line, = axes[0].plot([x["cpu_s"] for x in train], [x["mlm_loss"] for x in train], alpha=0.35, lw=1)
        axes[0].plot([x["cpu_s"] for x in evals], [x.get("eval_mlm_loss", x["eval_loss"]) for x in evals],
                     marker="o", color=line.get_color(), label=f"{label} (held-out: dots)")
        if run == "rtd":
            axes[1].plot([x["cpu_s"] for x in evals], [x["eval_rtd_accuracy"] for x in evals], marker="o",
                         label="held-out accuracy")
            axes[1].plot([x["cpu_s"] for x in evals], [x["eval_rtd_all_original"] for x in evals], ls="--",
                         label="all-original baseline")
            axes[1].plot([x["cpu_s"] for x in evals], [x["eval_rtd_f1"] for x in evals], marker="s",
                         label="replaced-token F1")
    axes[0].set(xlabel="training CPU seconds", ylabel="MLM loss (lines: training; dots: held-out)",
                title="MLM loss (the RTD run's is its generator's)")
    axes[1].set(xlabel="training CPU seconds", ylabel="share", title="RTD discriminator, held out")
    scores = summary(finetuned)
    tasks = sorted({t for _, t in scores}, reverse=True)
    bars = [*pretrained, *(["scratch"] if a.scratch else [])]
    width = 0.8 / max(1, len(bars))
    for i, run in enumerate(bars):
        xs = [j + i * width for j in range(len(tasks))]
        axes[2].bar(xs, [scores.get((run, t), (0, 0, 0))[0] for t in tasks], width,
                    yerr=[scores.get((run, t), (0, 0, 0))[1] / 2 for t in tasks], label=model_name(a, run), capsize=3)
    axes[2].set_xticks([j + width * (len(bars) - 1) / 2 for j in range(len(tasks))],
                       [{"sst2": "SST-2 accuracy", "cola": "CoLA MCC"}[t] for t in tasks])
    axes[2].set(title="fine-tuned, held out (mean of seeds, bar: half the spread)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main() -> None:
    a = parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    train, held_out = corpus_files()
    load, started = os.getloadavg(), time.perf_counter()
    files = {"train": train, "held_out": held_out, "tokenizer": shared_tokenizer(a, train)}
    old = json.loads(a.previous.read_text(encoding="utf-8")) if a.previous else {}
    pretrained = old.get("pretrain") or pretrain_all(a, files, a.cpu_per_step or calibrate(a, files))
    models = {run: r["out"] + "/model" for run, r in pretrained.items()}
    if a.scratch:
        models["scratch"] = scratch_model(a, Path(models.get("mlm", next(iter(models.values())))))
    finetuned = finetune_all(a, models, old.get("finetune", []))
    date = datetime.date.today().isoformat()
    title = (f"{a.size}: RTD vs MLM, {a.cpu_minutes:g} training CPU-minutes each, one thread, {a.batch_size} x "
             f"{a.max_length} tokens, lr {a.lr:g}; {date}, {os.cpu_count()} shared CPUs, load {load[0]:.1f} at the start")
    plot(a, pretrained, finetuned, a.work / "curves.png", title)
    results = {"date": date, "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
               "train_files": train, "held_out_files": held_out, "load_average_at_start": load,
               "load_average_at_end": os.getloadavg(), "wall_s": time.perf_counter() - started,
               "pretrain": pretrained, "finetune": finetuned}
    (a.work / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    text = tables(a, pretrained, finetuned)
    (a.work / "results.md").write_text(f"{title}\n\n{text}", encoding="utf-8")
    print(text)
    print(f"results in {a.work}: results.json, results.md, curves.png")


if __name__ == "__main__":
    main()
