"""Mixed-precision training speed on a GPU: bertforge's training step against transformers' on the same GPU, in
sequences per second.

Pure measurement: prints, never asserts. Both sides run the pretraining model of `bench/train_speed.py`
(`build_pair`: transformers' BertForPreTraining with its own init, SDPA attention, and bertforge's loaded from it)
on the same batches (`make_batch`: [CLS] A [SEP] B [SEP], 15 % labelled, a quarter of the rows shorter), with the
same fused AdamW (`make_adamw`). One step is what each library's training loop does:

  * bertforge: `bertforge.training.step.TrainStep.run`, the step every bertforge trainer takes: autocast to --precision,
    the fp16 loss scaler, clipping at 1.0, the non-finite check, AdamW, the schedule;
  * transformers: what its `Trainer` does through accelerate: autocast, `GradScaler` for fp16 (scale, unscale,
    step, update), `clip_grad_norm_(1.0)`, AdamW, `zero_grad`.

    python bench/train_speed_gpu.py --device cuda --configs bert-base,bert-large --seqs 128,512 --precisions bf16,fp16
    python bench/train_speed_gpu.py --device cpu --configs bert-tiny --seqs 32 --precisions bf16 --batch 4  # a check

Method: after --warmup steps of each, the two are interleaved step by step for --repeats rounds; each time is one
synchronised step; sequences/s = batch / median step time; "x HF" = the median over rounds of the per-round ratio.
Peak memory: `torch.cuda.max_memory_allocated` over one step. Prints the GPU's name, and one JSON line a case
(`RESULT {...}`) to paste into bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: train_speed's models and batches
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from train_speed import build_pair, family_batch, hf_loss, loss_check, make_adamw, make_batch, med, ours_loss, sync  # noqa: E402

from bertforge.training.optim import warmup_decay  # noqa: E402
from bertforge.training.step import TrainStep, pick_precision  # noqa: E402

# default batch per (size, sequence length): fits an 80 GB H100 in fp16/bf16 with room to spare
BATCH = {("base", 128): 64, ("base", 512): 16, ("large", 128): 32, ("large", 512): 8}
SMALL_BATCH = 8  # any other size


class BertforgeStep:
    """bertforge's training step: the shared TrainStep on the model."""

    name = "bertforge"

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None, compile: bool) -> None:
        self.model = model
        self.call = torch.compile(model) if compile else model
        opt = make_adamw(model, "default")
        self.stepper = TrainStep(model, opt, warmup_decay(opt, 0, 10**9, "constant"), max_grad_norm=1.0,
                                 device=device, precision=dtype)

    def forward_backward(self, batch, weights):
        with self.stepper.autocast():
            loss = ours_loss(self.call, batch)
        return {"loss": self.stepper.accumulate({"loss": loss}, weights)}

    def __call__(self, batch) -> bool:
        """One step; True when it updated (not skipped by the fp16 scaler)."""
        return not self.stepper.run([batch], self.forward_backward, lambda b: {"loss": 1}).skipped


class TransformersStep:
    """transformers' Trainer step (accelerate's autocast and GradScaler, clipping at 1.0, AdamW)."""

    name = "transformers"

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None, compile: bool) -> None:
        self.model, self.device, self.dtype = model, device, dtype
        self.call = torch.compile(model) if compile else model
        self.opt = make_adamw(model, "default")
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)

    def __call__(self, batch) -> bool:
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            loss = hf_loss(self.call, batch)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.opt)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.step(self.opt)
        self.scaler.update()
        self.opt.zero_grad(set_to_none=True)
        return scale is None or self.scaler.get_scale() >= scale  # the scale only drops on a skipped step


def timed(step, batch, device: torch.device) -> tuple[float, int, bool]:
    """(seconds, peak bytes allocated on CUDA, updated) of one synchronised step."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sync(device)
    t0 = time.perf_counter()
    updated = step(batch)
    sync(device)
    seconds = time.perf_counter() - t0
    return seconds, torch.cuda.max_memory_allocated() if device.type == "cuda" else 0, updated


def measure(steps: list, batch, device: torch.device, warmup: int, repeats: int) -> dict[str, dict]:
    """Warm each step up, then interleave them for `repeats` rounds."""
    for step in steps:
        for _ in range(warmup):
            step(batch)
    times = {s.name: [] for s in steps}
    peaks = {s.name: 0 for s in steps}
    skipped = {s.name: 0 for s in steps}
    for i in range(repeats):
        for step in steps:
            seconds, peak, updated = timed(step, batch, device)
            times[step.name].append(seconds)
            peaks[step.name] = max(peaks[step.name], peak)
            skipped[step.name] += not updated
        print(f"    round {i + 1}/{repeats}: " + "  ".join(f"{n} {t[-1] * 1e3:.1f} ms" for n, t in times.items()),
              flush=True)
    hf = times["transformers"]
    return {n: dict(ms=med(t) * 1e3, x_hf=med([h / x for h, x in zip(hf, t)]), peak=peaks[n], skipped=skipped[n],
                    spread=(min(t) * 1e3, max(t) * 1e3)) for n, t in times.items()}


def run_case(name: str, seq: int, precision: str, args, device: torch.device) -> list[dict]:
    size = name.rpartition("-")[2]
    B = args.batch or BATCH.get((size, seq), SMALL_BATCH)
    print(f"\n=== {name}, seq {seq}, batch {B}, {precision}{', compiled' if args.compile else ''} ===", flush=True)
    cfg, hf, ours = build_pair(name, device)
    if seq > cfg.max_position_embeddings:
        raise SystemExit(f"--seqs {seq}: {name} has {cfg.max_position_embeddings} positions")
    batch = {k: v.to(device) for k, v in family_batch(make_batch(B, seq, packed=False), cfg).items()}
    a, b = loss_check(hf, ours, batch)
    print(f"  loss check (fp32, eval, same weights): transformers {a:.5f} bertforge {b:.5f} |diff| {abs(a - b):.1e}")
    dtype = pick_precision(precision, device)
    steps = [BertforgeStep(ours, device, dtype, args.compile), TransformersStep(hf, device, dtype, args.compile)]
    try:
        results = measure(steps, batch, device, args.warmup, args.repeats)
    except torch.cuda.OutOfMemoryError:
        print(f"  out of GPU memory at batch {B}: lower --batch")
        return []
    finally:
        del steps, hf, ours
        if device.type == "cuda":
            torch.cuda.empty_cache()
    rows = []
    for impl, r in results.items():
        row = dict(config=name, seq=seq, batch=B, precision=precision, compile=args.compile, impl=impl,
                   seq_per_s=round(B / (r["ms"] / 1e3), 1), ms=round(r["ms"], 2), x_hf=round(r["x_hf"], 3),
                   peak_gib=round(r["peak"] / 2**30, 2), skipped=r["skipped"], device=args.device_name)
        print("RESULT " + json.dumps(row))
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    hdr = f"{'config':11} {'seq':>4} {'batch':>5} {'prec':5} {'impl':13} {'seq/s':>9} {'ms/step':>8} {'x HF':>6} {'peak GiB':>8}"
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for r in rows:
        print(f"{r['config']:11} {r['seq']:4} {r['batch']:5} {r['precision']:5} {r['impl']:13} {r['seq_per_s']:9.1f} "
              f"{r['ms']:8.1f} {r['x_hf']:6.2f} {r['peak_gib']:8.2f}")


def device_name(device: torch.device) -> str:
    if device.type != "cuda":
        import platform

        return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    props = torch.cuda.get_device_properties(device)
    return f"{props.name} ({props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="bert-base,bert-large", help="presets, comma-separated (default bert-base,bert-large)")
    ap.add_argument("--seqs", default="128,512", help="sequence lengths, comma-separated (default 128,512)")
    ap.add_argument("--precisions", default="bf16,fp16", help="of fp32, bf16, fp16; comma-separated (default bf16,fp16)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--batch", type=int, default=None, help="sequences a step (default: per config and length, "
                    + ", ".join(f"{s}@{n}: {b}" for (s, n), b in BATCH.items()) + f"; {SMALL_BATCH} otherwise)")
    ap.add_argument("--warmup", type=int, default=5, help="steps of each before measuring (default 5)")
    ap.add_argument("--repeats", type=int, default=20, help="interleaved measured rounds (default 20)")
    ap.add_argument("--compile", action="store_true", help="torch.compile both models")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA GPU here (use --device cpu for a check of the script)")
    precisions = [p for p in args.precisions.split(",") if p]
    if not set(precisions) <= {"fp32", "bf16", "fp16"}:
        ap.error(f"--precisions: choose from fp32, bf16, fp16, got {args.precisions}")
    device = torch.device(args.device)
    args.device_name = device_name(device)
    import transformers

    print(f"device: {args.device_name}; torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"transformers {transformers.__version__}; TF32 matmul {torch.backends.cuda.matmul.allow_tf32}")
    rows = []
    for name in [c for c in args.configs.split(",") if c]:
        for seq in [int(s) for s in args.seqs.split(",") if s]:
            for precision in precisions:
                rows += run_case(name, seq, precision, args, device)
    print_table(rows)


if __name__ == "__main__":
    main()
