"""Training-step speed: bertforge's BertForPreTraining against transformers' on identical batches.

Pure measurement: prints, never asserts. One "step" = forward + backward + AdamW step (+ zero_grad), in train mode
(dropout on), fp32. Both models start from the same weights (transformers' init, loaded into bertforge through a
saved checkpoint) and use the same optimizer (`bertforge.training.optim.make_optimizer(model, "adamw", ...)`).

    .venv/bin/python bench/train_speed.py                          # mini, small, base; padded and packed batches
    .venv/bin/python bench/train_speed.py --configs mini --profile # + where bertforge's step spends its time

Method (details and the FLOP accounting in bench/README.md):
  * after --warmup steps of each, the implementations are interleaved step by step (round = bertforge step,
    transformers step, a few GEMMs of the config's shapes); times are medians over --repeats rounds, the ratio is
    the median of the per-round ratios (robust to other load on the machine drifting during the run);
  * tokens/s headline = real (non-padding) tokens per second; total positions (B*S) per second printed too;
  * MFU = useful FLOPs / step time / peak, with the same useful-FLOP count for both implementations and the peak
    = median throughput of fp32 GEMMs of the config's own shapes measured in the same rounds, same threads, through
    `bertforge.core.linear` with each of its backends (`linear_backend("aten")`: MKL via F.linear; "onednn" where
    `onednn_available()`);
  * memory: CUDA max_memory_allocated; CPU resident-set high-water mark (VmHWM, reset per step through
    /proc/self/clear_refs), printed as the step's growth over the RSS before it and as the absolute peak.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable


def _apply_env_flags() -> None:
    """--omp-wait-policy and --thp must reach libgomp / c10's allocator before torch loads: re-exec with the
    environment variables set."""
    wanted = {}
    for i, a in enumerate(sys.argv):
        if a.startswith("--omp-wait-policy"):
            value = a.split("=", 1)[1] if "=" in a else (sys.argv[i + 1] if i + 1 < len(sys.argv) else "")
            if value and value.lower() != "default":
                wanted["OMP_WAIT_POLICY"] = value.upper()
        if a == "--thp":
            wanted["THP_MEM_ALLOC_ENABLE"] = "1"
        if a == "--jemalloc":  # jemalloc that never gives freed pages back: reused memory takes no page faults
            lib = next((p for p in ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib64/libjemalloc.so.2",
                                    "/usr/lib/libjemalloc.so.2", "/usr/local/lib/libjemalloc.so.2") if os.path.exists(p)), None)
            if lib is None:
                sys.exit("--jemalloc: libjemalloc.so.2 not found (Debian/Ubuntu: apt-get install libjemalloc2)")
            wanted["LD_PRELOAD"] = lib
            wanted["MALLOC_CONF"] = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
    missing = {k: v for k, v in wanted.items() if os.environ.get(k, "").upper() != v.upper()}
    if missing:
        os.environ.update(missing)
        os.execv(sys.executable, [sys.executable, *sys.argv])


if __name__ == "__main__":
    _apply_env_flags()

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bertforge  # noqa: E402
from bertforge.model.config import BertConfig  # noqa: E402
from bertforge.core.linear import get_linear_backend, linear, linear_backend, onednn_available  # noqa: E402
from bertforge.training.optim import make_optimizer, parameter_groups  # noqa: E402

VOCAB = 30522
SEQ = 128
CLS, SEP, MASK, PAD = 101, 102, 103, 0
BATCH = {"mini": 16, "small": 16, "base": 8}
LR, WD = 1e-4, 0.01


# ---------------------------------------------------------------------------------------------------- batches
def make_batch(B: int, S: int, packed: bool, seed: int = 1234, short_frac: float = 0.25) -> dict[str, torch.Tensor]:
    """A BERT pretraining batch: [CLS] A [SEP] B [SEP] [PAD]..., 15% of real non-special tokens labelled
    (80% [MASK] / 10% random / 10% kept), labels -100 elsewhere, random NSP labels.

    Padded variant: round(short_frac * B) sequences (at fixed-seed random rows) get a real length drawn
    uniformly from [16, S-1]; the rest are full. Packed variant: every sequence is S real tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((B,), S)
    if not packed:
        n_short = max(1, round(short_frac * B))
        rows = torch.randperm(B, generator=g)[:n_short]
        lengths[rows] = torch.randint(16, S, (n_short,), generator=g)
    ids = torch.randint(1000, VOCAB, (B, S), generator=g)
    attention_mask = torch.zeros(B, S, dtype=torch.long)
    token_type_ids = torch.zeros(B, S, dtype=torch.long)
    special = torch.zeros(B, S, dtype=torch.bool)
    for b, n in enumerate(lengths.tolist()):
        a_len = int(torch.randint(1, n - 3, (1,), generator=g))  # [CLS] + a_len + [SEP] + rest + [SEP] = n
        ids[b, 0], ids[b, a_len + 1], ids[b, n - 1] = CLS, SEP, SEP
        special[b, [0, a_len + 1, n - 1]] = True
        ids[b, n:] = PAD
        attention_mask[b, :n] = 1
        token_type_ids[b, a_len + 2 : n] = 1
    candidates = attention_mask.bool() & ~special
    pick = (torch.rand(B, S, generator=g) < 0.15) & candidates
    labels = torch.where(pick, ids, torch.full_like(ids, -100))
    r = torch.rand(B, S, generator=g)
    input_ids = ids.clone()
    input_ids[pick & (r < 0.8)] = MASK
    rand_tok = pick & (r >= 0.8) & (r < 0.9)
    input_ids[rand_tok] = torch.randint(1000, VOCAB, (int(rand_tok.sum()),), generator=g)
    nsp = torch.randint(0, 2, (B,), generator=g)
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                labels=labels, next_sentence_label=nsp)


# ---------------------------------------------------------------------------------------------------- FLOPs
@dataclass
class Flops:
    useful: float  # what a step must compute: real tokens, real attention pairs, labelled MLM positions
    ours: float  # what bertforge executes (dense layers on the real tokens only: it unpads when labels are given)
    hf: float  # what transformers executes (every position through the vocabulary projection)


def step_flops(cfg: BertConfig, batch: dict[str, torch.Tensor]) -> Flops:
    """Matmul FLOPs of one training step (forward + backward = 3 x forward = 6 x params x rows).

    dense: 6 * (4H^2 + 2*H*I) per layer per token (QKV, attention output, FFN in/out);
    attention: 12 * S_q * S_k * H per layer per sequence (QK^T and PV, forward 4*S^2*H, x3);
    MLM head: 6 * (H^2 + V*H) per projected position (transform dense + tied decoder);
    pooler + NSP: 6 * (H^2 + 2H) per sequence. Embedding look-ups, LayerNorm, softmax, GELU, dropout,
    cross-entropy and the optimizer are not counted (no matmul)."""
    L, H, I, V, E = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.embedding_dim
    B, S = batch["input_ids"].shape
    lengths = batch["attention_mask"].sum(1).double()
    real, total = float(lengths.sum()), float(B * S)
    n_lab = float((batch["labels"] != -100).sum())
    dense = 6.0 * L * (4 * H * H + 2 * H * I)
    attn_useful = 12.0 * L * H * float((lengths**2).sum())
    attn_all = 12.0 * L * H * B * S * S
    head = 6.0 * (H * E + V * E)  # transform H -> E, tied decoder E -> V (E = H except for ALBERT)
    pool = 6.0 * (H * H + 2 * H) * B
    useful = dense * real + attn_useful + head * n_lab + pool
    ours = dense * real + attn_all + head * n_lab + pool  # unpadded encoder; attention still runs on [B, S]
    hf = dense * total + attn_all + head * total + pool
    return Flops(useful, ours, hf)


# ---------------------------------------------------------------------------------------------------- timing helpers
CLOCK = time.perf_counter  # --clock cpu: time.process_time (this process's CPU seconds, all its threads)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _read_status(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class MemoryProbe:
    """Peak memory of one step. CUDA: max_memory_allocated (exact, allocator-level). CPU: VmHWM (resident-set
    high-water mark) reset before the step through /proc/self/clear_refs; growth = HWM - RSS before the step."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.can_reset = device.type == "cpu" and _reset_hwm()

    def __enter__(self) -> "MemoryProbe":
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        else:
            self.before = _read_status("VmRSS") or 0
            if self.can_reset:
                _reset_hwm()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated()
        elif self.can_reset:
            self.peak = _read_status("VmHWM") or 0
        else:  # ru_maxrss: whole-process, never reset; only an upper bound
            self.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.growth = self.peak - self.before


class Runner:
    """One trainable implementation: model, optimizer, the call that returns the loss."""

    def __init__(self, name: str, model: torch.nn.Module, loss_fn: Callable, opt: torch.optim.Optimizer,
                 flops_exec: float) -> None:
        self.name, self.model, self.loss_fn, self.opt, self.flops_exec = name, model, loss_fn, opt, flops_exec
        self.times: list[float] = []
        self.mem: list[tuple[int, int]] = []
        self.first_step_s: float | None = None

    def step(self, batch, device, record: bool, probe_mem: bool = False) -> float:
        probe = MemoryProbe(device) if probe_mem else None
        if probe:
            probe.__enter__()
        sync(device)
        t0 = CLOCK()
        loss = self.loss_fn(self.model, batch)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        sync(device)
        dt = CLOCK() - t0
        if probe:
            probe.__exit__(None, None, None)
            self.mem.append((probe.peak, probe.growth))
        if self.first_step_s is None:
            self.first_step_s = dt
        if record:
            self.times.append(dt)
        return dt


def saved_activation_bytes(model, loss_fn, batch) -> int:
    """Bytes of the distinct tensors autograd saves for backward in one training-mode forward (parameters
    excluded): the activation memory, independent of the allocator (which RSS is not)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model, batch)
    del loss
    return sum(seen.values())


class GemmPeak:
    """fp32 GEMM throughput of the config's own shapes, as the model calls them: x[B*S, H] @ W[4H, H]^T and
    x[B*S, 4H] @ W[H, 4H]^T (FFN in / out), through `bertforge.core.linear.linear` with each of its backends: "mkl" =
    `linear_backend("aten")` (F.linear, ATen -> MKL sgemm, what transformers uses) and "onednn" =
    `linear_backend("onednn")` (oneDNN's kernels, what bertforge's dense layers run on CPU by default), the latter
    where `bertforge.core.linear.onednn_available()`. `sample()` times each a few times per round; rates are medians over
    rounds; the peak is the best of them."""

    BACKENDS = {"mkl": "aten", "onednn": "onednn"}  # name in the table -> bertforge.core.linear backend

    def __init__(self, rows: int, H: int, I: int, device: torch.device) -> None:
        g = torch.Generator().manual_seed(0)
        self.device = device
        self.cases = []
        names = ["mkl"] + (["onednn"] if device.type == "cpu" and onednn_available() else [])
        for k, n in ((H, I), (I, H)):
            x = torch.randn(rows, k, generator=g).to(device)
            w = torch.randn(n, k, generator=g).to(device)
            b = torch.randn(n, generator=g).to(device)
            for name in names:
                self.cases.append((name, x, w, b, 2.0 * rows * k * n))
        self.samples: list[list[float]] = [[] for _ in self.cases]
        for _ in range(2):
            self.sample(2)  # warm-up

    def sample(self, n: int = 5) -> None:
        for i, (name, x, w, b, fl) in enumerate(self.cases):
            ts = []
            with linear_backend(self.BACKENDS[name]):
                for _ in range(n):
                    sync(self.device)
                    t0 = CLOCK()
                    linear(x, w, b)
                    sync(self.device)
                    ts.append(CLOCK() - t0)
            self.samples[i].append(fl / statistics.median(ts))

    def peak(self, backend: str | None = None) -> float:
        """Best over shapes (and backends, unless one is named) of the median-over-rounds rate, FLOP/s."""
        rates = [statistics.median(s) for c, s in zip(self.cases, self.samples) if s and backend in (None, c[0])]
        return max(rates) if rates else float("nan")


# ---------------------------------------------------------------------------------------------------- models
def hf_config(cfg: BertConfig):
    """transformers' config class of the family (BertConfig, RobertaConfig, AlbertConfig, ...), from bertforge's
    config.json."""
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        cfg.save_pretrained(tmp)
        return transformers.AutoConfig.from_pretrained(tmp, attn_implementation="sdpa")


def build_pair(name: str, device: torch.device, seed: int = 0):
    """transformers' pretraining class of the family (its own init: BertForPreTraining, AlbertForPreTraining,
    RobertaForMaskedLM, DistilBertForMaskedLM) and bertforge's loaded from it through a saved checkpoint."""
    import transformers

    transformers.utils.logging.disable_progress_bar()
    cfg = BertConfig.preset(name, vocab_size=VOCAB)
    torch.manual_seed(seed)
    ours_class = bertforge.AutoModelForPreTraining.model_class(cfg)
    hf = getattr(transformers, cfg.family.architecture(ours_class.__name__))(hf_config(cfg))
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours = bertforge.AutoModelForPreTraining.from_pretrained(tmp)
    ours.set_attn_implementation("sdpa")
    return cfg, hf.to(device), ours.to(device)


def family_batch(batch: dict[str, torch.Tensor], cfg: BertConfig) -> dict[str, torch.Tensor]:
    """The BERT batch as the family's pretraining class takes it: no NSP label without a sentence head, no token
    types for DistilBERT (one type for RoBERTa), padding with the family's pad id."""
    batch = dict(batch)
    if not cfg.family.sentence_head:
        del batch["next_sentence_label"]
    if cfg.type_vocab_size == 0:
        del batch["token_type_ids"]
    elif cfg.type_vocab_size == 1:
        batch["token_type_ids"] = torch.zeros_like(batch["token_type_ids"])
    batch["input_ids"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, cfg.pad_token_id)
    return batch


def ours_loss(model, batch):
    return model(**batch).loss


def hf_loss(model, batch):
    if "next_sentence_label" in batch and type(model).__name__.startswith("Albert"):  # SOP, under its own name
        batch = {("sentence_order_label" if k == "next_sentence_label" else k): v for k, v in batch.items()}
    return model(**batch).loss


def loss_check(hf, ours, batch) -> tuple[float, float]:
    """Same weights, same batch, eval mode (no dropout): |loss_bertforge - loss_transformers|."""
    hf.eval(), ours.eval()
    with torch.no_grad():
        a = float(hf_loss(hf, batch))
        b = float(ours_loss(ours, batch))
    hf.train(), ours.train()
    return a, b


def make_adamw(model, kind: str) -> torch.optim.Optimizer:
    if kind == "default":  # what bertforge.pretrain.trainer builds: fused AdamW wherever the kernel applies
        return make_optimizer(model, "adamw", LR, WD)
    kwargs = dict(lr=LR, betas=(0.9, 0.999), eps=1e-6)
    kwargs["foreach" if kind == "foreach" else "fused"] = True
    return torch.optim.AdamW(parameter_groups(model, WD), **kwargs)


# ---------------------------------------------------------------------------------------------------- reporting
def fmt_bytes(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def interleave(runners: list[Runner], batch, device, warmup: int, repeats: int, gemm: GemmPeak | None, log=print):
    for r in runners:  # warm-up, each implementation in turn
        for _ in range(warmup):
            r.step(batch, device, record=False)
    for i in range(repeats):
        for r in runners:
            r.step(batch, device, record=True, probe_mem=(i == 0))
        if gemm is not None:
            gemm.sample()
        log(f"    round {i + 1}/{repeats}: " + "  ".join(f"{r.name} {r.times[-1] * 1e3:.0f} ms" for r in runners), flush=True)


def ratio(a: Runner, b: Runner) -> float:
    """Median over rounds of time(a)/time(b): how much faster b is than a."""
    return med([x / y for x, y in zip(a.times, b.times)])


def run_config(name: str, args, device: torch.device) -> list[dict]:
    size = name.rpartition("-")[2]
    print(f"\n=== {name}: batch {BATCH[size] if args.batch is None else args.batch} x seq {SEQ} ===", flush=True)
    t0 = time.perf_counter()
    cfg, hf, ours = build_pair(name, device)
    B = BATCH[size] if args.batch is None else args.batch
    n_enc = sum(p.numel() for n, p in ours.named_parameters() if ".encoder." in n)
    print(f"  params: {ours.num_parameters() / 1e6:.1f} M total, {n_enc / 1e6:.1f} M in the encoder "
          f"(built in {time.perf_counter() - t0:.1f} s)")
    batches = {v: {k: t.to(device) for k, t in family_batch(make_batch(B, SEQ, packed=(v == "packed")), cfg).items()}
               for v in args.variants}
    for variant, batch in batches.items():  # loss checks first, while every model still has the initial weights
        real, n_lab = int(batch["attention_mask"].sum()), int((batch["labels"] != -100).sum())
        a, b = loss_check(hf, ours, batch)
        print(f"  [{variant}] real tokens {real}/{B * SEQ} ({real / (B * SEQ):.1%}), labelled {n_lab}; "
              f"loss check (eval, same weights): transformers {a:.6f} bertforge {b:.6f} |diff| {abs(a - b):.2e} "
              f"({'within' if abs(a - b) <= 1e-4 else 'OUTSIDE'} 1e-4)", flush=True)
    rows = []
    for variant, batch in batches.items():
        real, total = int(batch["attention_mask"].sum()), B * SEQ
        fl = step_flops(cfg, batch)
        # fresh optimizers per variant; the models keep training from where they are (timing only)
        runners = [Runner("bertforge", ours, ours_loss, make_adamw(ours, args.optimizer), fl.ours),
                   Runner("transformers", hf, hf_loss, make_adamw(hf, args.optimizer), fl.hf)]
        acts = {r.name: saved_activation_bytes(r.model, r.loss_fn, batch) for r in runners}
        gemm = GemmPeak(total, cfg.hidden_size, cfg.intermediate_size, device)
        interleave(runners, batch, device, args.warmup, args.repeats, gemm)
        peak, peak_mkl = gemm.peak(), gemm.peak("mkl")
        for r in runners:
            t = med(r.times)
            rows.append(dict(config=name, variant=variant, impl=r.name, ms=t * 1e3, real_tps=real / t,
                             total_tps=total / t, mfu=fl.useful / t / peak, mfu_mkl=fl.useful / t / peak_mkl,
                             hfu=r.flops_exec / t / peak, peak_gflops=peak / 1e9, peak_mkl_gflops=peak_mkl / 1e9,
                             mem_peak=r.mem[0][0], mem_growth=r.mem[0][1], act=acts[r.name],
                             speedup=ratio(runners[1], r), spread=(min(r.times) * 1e3, max(r.times) * 1e3)))
        del runners
    if args.profile:
        profile_step(ours, ours_loss, make_adamw(ours, args.optimizer),
                     {k: v.to(device) for k, v in family_batch(make_batch(B, SEQ, packed=False), cfg).items()}, device,
                     args.profile_rows)
    return rows


def print_table(rows: list[dict], legend: bool = True) -> None:
    if legend:
        _legend()
    hdr = (f"{'config':7} {'batch':7} {'impl':13} {'ms/step':>8} {'(min-max)':>13} {'real tok/s':>11} {'pos/s':>8} "
           f"{'x HF':>6} {'MFU':>6} {'MFU/mkl':>7} {'HFU':>6} {'peak GF/s':>9} {'mkl GF/s':>8} {'saved act':>10} "
           f"{'RSS peak':>10} {'step +RSS':>10}")
    print("\n" + hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['config']:7} {r['variant']:7} {r['impl']:13} {r['ms']:8.0f} {r['spread'][0]:6.0f}-{r['spread'][1]:<6.0f} "
              f"{r['real_tps']:11,.0f} {r['total_tps']:8,.0f} {r['speedup']:6.2f} {r['mfu']:6.1%} {r['mfu_mkl']:7.1%} "
              f"{r['hfu']:6.1%} {r['peak_gflops']:9.1f} {r['peak_mkl_gflops']:8.1f} {fmt_bytes(r['act']):>10} "
              f"{fmt_bytes(r['mem_peak']):>10} {fmt_bytes(r['mem_growth']):>10}")


def _legend() -> None:
    print("\nheadline: real (non-padding) tokens/s; 'pos/s' counts every position (B*S) including padding;"
          " 'x HF' = median per-round speed-up over transformers.")
    print("MFU = useful FLOPs / time / peak, the same useful count for every row; peak = best fp32 GEMM rate of the"
          " config's FFN shapes measured in the same rounds (over MKL via F.linear and oneDNN); 'MFU/mkl' uses the"
          " F.linear (MKL) GEMM rate instead; HFU = FLOPs the row's implementation executes / time / peak.")
    print("memory: 'saved act' = tensors autograd keeps for backward (exact, allocator-independent); 'RSS peak' = the"
          " process's resident high-water mark during the step (every model of the run is resident: compare rows"
          " through 'step +RSS', the growth over the RSS before the step, which allocator caching can hide).")


# ---------------------------------------------------------------------------------------------------- profile
CATEGORIES = [
    ("matmul: linear (MKL mm/addmm or oneDNN)", ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear",
                                                "_linear_pointwise")),
    ("matmul: attention bmm (SDPA math path)", ("aten::bmm", "aten::baddbmm")),
    ("attention (SDPA fwd+bwd)", ("scaled_dot_product", "flash_attention")),
    ("optimizer (AdamW)", ("adam", "_foreach", "aten::lerp", "aten::addcdiv", "aten::addcmul", "aten::sqrt", "aten::_fused")),
    ("layer norm", ("layer_norm",)),
    ("gelu", ("gelu",)),
    ("dropout / RNG", ("dropout", "bernoulli", "aten::rand", "uniform_")),
    ("embedding fwd/bwd", ("embedding",)),
    ("softmax / cross-entropy", ("softmax", "nll_loss", "cross_entropy")),
    ("copies / cat / index / zeros", ("aten::copy_", "aten::cat", "aten::index", "aten::clone", "aten::zero_", "aten::fill_",
                                     "aten::contiguous", "aten::new_zeros", "aten::zeros", "aten::empty", "aten::scatter",
                                     "aten::gather", "aten::nonzero", "aten::_unsafe_view")),
    ("elementwise add/mul/div/sum", ("aten::add", "aten::mul", "aten::div", "aten::sum", "aten::tanh", "aten::sub", "aten::where")),
]


def categorize(key: str) -> str:
    k = key.lower()
    for name, pats in CATEGORIES:
        if any(p.lower() in k for p in pats):
            return name
    return "other"


def profile_step(model, loss_fn, opt, batch, device, top: int, title: str = "bertforge", steps: int = 3) -> None:
    """torch.profiler over `steps` training steps (averaged per step: one step is too noisy on a shared machine)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):  # warm
        loss_fn(model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=acts, record_shapes=False) as prof:
        for _ in range(steps):
            loss_fn(model, batch).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync(device)
    wall = (time.perf_counter() - t0) / steps
    ka = prof.key_averages()
    print(f"\n--- profile: {title} training step (padded batch), {steps} steps, {wall * 1e3:.0f} ms per step under "
          f"the profiler; times below are totals over the {steps} steps ---")
    print(ka.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=60))
    total = sum(e.self_cpu_time_total for e in ka)
    cats: dict[str, float] = {}
    for e in ka:
        cats[categorize(e.key)] = cats.get(categorize(e.key), 0.0) + e.self_cpu_time_total
    print("self CPU time by category, per step (share of the step's self CPU time):")
    for k, v in sorted(cats.items(), key=lambda kv: -kv[1]):
        print(f"  {k:40} {v / 1e3 / steps:9.1f} ms  {v / total:6.1%}")


# ---------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="mini,small,base",
                    help="comma-separated presets (default: mini,small,base); FAMILY-SIZE for another family member "
                         "(roberta-mini, albert-base, distilbert-mini, ...)")
    ap.add_argument("--family", default=None, help="prefix every bare size in --configs with this family (roberta, ...)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--repeats", type=int, default=5, help="measured interleaved rounds (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up steps per implementation (default 2)")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch.get_num_threads())")
    ap.add_argument("--omp-wait-policy", default="default", choices=["default", "passive", "active"],
                    help="set OMP_WAIT_POLICY (re-executes the script); passive helps on an oversubscribed machine")
    ap.add_argument("--thp", action="store_true",
                    help="set THP_MEM_ALLOC_ENABLE=1 (re-executes the script): c10's CPU allocator then backs tensors"
                         " over 2 MiB with transparent huge pages, so fresh large tensors fault 512x fewer pages")
    ap.add_argument("--jemalloc", action="store_true",
                    help="LD_PRELOAD libjemalloc.so.2 with MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 (re-executes"
                         " the script): freed memory stays mapped and is reused without page faults")
    ap.add_argument("--malloc-reuse", action="store_true",
                    help="bertforge.core.system.reuse_freed_memory() first, as `bertforge pretrain` does on CPU (glibc keeps"
                         " freed memory for reuse; process-wide, so transformers' steps get it too)")
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                    help="wall: time.perf_counter (default); cpu: time.process_time, this process's CPU time, which "
                         "leaves out the time other processes hold the cores (use with --threads 1 on a busy machine)")
    ap.add_argument("--batch", type=int, default=None, help="override the batch size (default 16; 8 for base)")
    ap.add_argument("--variants", default="padded,packed", help="padded, packed or both (default both)")
    ap.add_argument("--optimizer", default="default", choices=["default", "foreach", "fused"],
                    help="AdamW implementation for both models (default: make_optimizer's, fused where supported)")
    ap.add_argument("--profile", action="store_true", help="print the top ops of one bertforge step")
    ap.add_argument("--profile-rows", type=int, default=25)
    args = ap.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    device = torch.device(args.device)
    global CLOCK
    if args.clock == "cpu":
        if device.type == "cuda":
            ap.error("--clock cpu measures host CPU time; use wall with --device cuda")
        CLOCK = time.process_time
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
        torch.backends.cudnn.allow_tf32 = False
    if args.threads:
        torch.set_num_threads(args.threads)
    from bertforge.core.system import apply_switches, read_switches

    apply_switches(read_switches())  # BERTFORGE_LINEAR=aten: the reference kernels for the whole run
    if args.malloc_reuse:
        from bertforge.core.system import reuse_freed_memory

        if not reuse_freed_memory():
            ap.error("--malloc-reuse: not available here (needs glibc; unset MALLOC_* and LD_PRELOAD)")
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}, "
          f"threads {torch.get_num_threads()} (os.cpu_count {os.cpu_count()}), fp32, train mode (dropout on), "
          f"clock {args.clock}")
    print(f"bertforge linear backend {get_linear_backend()} (BERTFORGE_LINEAR; oneDNN "
          f"{'available' if onednn_available() else 'not available'} in this torch build)")
    if args.clock == "cpu" and torch.get_num_threads() > 1:
        print("note: --clock cpu with several threads adds up every thread's CPU time, spin-waits included")
    load = os.getloadavg()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in load)}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, "
          f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', '(unset)')}, "
          f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '(unset)')}, malloc reuse {'on' if args.malloc_reuse else 'off'}")
    if device.type == "cpu" and load[0] > (os.cpu_count() or 1):
        print(f"WARNING: load average {load[0]:.1f} > {os.cpu_count()} CPUs: other processes share the cores; absolute "
              "times are inflated and multi-threaded ops stall when a thread is descheduled (try --threads 1 --clock cpu,"
              " or --omp-wait-policy passive). Ratios are per-round, interleaved; the peak is measured in the same rounds.")
    if device.type == "cpu" and not _reset_hwm():
        print("note: /proc/self/clear_refs not writable: CPU memory is ru_maxrss, a whole-process high-water mark")
    rows: list[dict] = []
    for name in [c for c in args.configs.split(",") if c]:
        if args.family and "-" not in name:
            name = f"{args.family}-{name}"
        new = run_config(name, args, device)
        print_table(new, legend=False)  # each config as it completes; all of them again at the end
        rows.extend(new)
    if rows:
        print_table(rows)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
