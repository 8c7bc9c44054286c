"""Training-step speed: bertforge's BertForPreTraining against transformers' on identical batches.

Pure measurement: prints, never asserts. One "step" = forward + backward + AdamW step (+ zero_grad), in train mode
(dropout on), fp32. Both models start from the same weights (transformers' init, loaded into bertforge through a
saved checkpoint) and use the same optimizer (`bertforge.optim.make_optimizer(model, "adamw", ...)`).

    .venv/bin/python bench/train_speed.py                          # mini, small, base; padded and packed batches
    .venv/bin/python bench/train_speed.py --configs mini --profile # + where bertforge's step spends its time
    .venv/bin/python bench/train_speed.py --configs base --experiments   # A/B of candidate model.py speed-ups

Method (details and the FLOP accounting in bench/README.md):
  * after --warmup steps of each, the implementations are interleaved step by step (round = bertforge step,
    transformers step, a few GEMMs of the config's shapes); times are medians over --repeats rounds, the ratio is
    the median of the per-round ratios (robust to other load on the machine drifting during the run);
  * tokens/s headline = real (non-padding) tokens per second; total positions (B*S) per second printed too;
  * MFU = useful FLOPs / step time / peak, with the same useful-FLOP count for both implementations and the peak
    = median throughput of fp32 GEMMs of the config's own shapes measured in the same rounds, same threads;
  * memory: CUDA max_memory_allocated; CPU resident-set high-water mark (VmHWM, reset per step through
    /proc/self/clear_refs), printed as the step's growth over the RSS before it and as the absolute peak.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bertforge  # noqa: E402
from bertforge.config import BertConfig  # noqa: E402
from bertforge.optim import make_optimizer, parameter_groups  # noqa: E402

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
    ours: float  # what bertforge's (padded) path executes
    hf: float  # what transformers executes (every position through the vocabulary projection)


def step_flops(cfg: BertConfig, batch: dict[str, torch.Tensor], unpadded: bool = False) -> Flops:
    """Matmul FLOPs of one training step (forward + backward = 3 x forward = 6 x params x rows).

    dense: 6 * (4H^2 + 2*H*I) per layer per token (QKV, attention output, FFN in/out);
    attention: 12 * S_q * S_k * H per layer per sequence (QK^T and PV, forward 4*S^2*H, x3);
    MLM head: 6 * (H^2 + V*H) per projected position (transform dense + tied decoder);
    pooler + NSP: 6 * (H^2 + 2H) per sequence. Embedding look-ups, LayerNorm, softmax, GELU, dropout,
    cross-entropy and the optimizer are not counted (no matmul)."""
    L, H, I, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    B, S = batch["input_ids"].shape
    lengths = batch["attention_mask"].sum(1).double()
    real, total = float(lengths.sum()), float(B * S)
    n_lab = float((batch["labels"] != -100).sum())
    dense = 6.0 * L * (4 * H * H + 2 * H * I)
    attn_useful = 12.0 * L * H * float((lengths**2).sum())
    attn_all = 12.0 * L * H * B * S * S
    head = 6.0 * (H * H + V * H)
    pool = 6.0 * (H * H + 2 * H) * B
    useful = dense * real + attn_useful + head * n_lab + pool
    ours = dense * (real if unpadded else total) + attn_all + head * n_lab + pool
    hf = dense * total + attn_all + head * total + pool
    return Flops(useful, ours, hf)


# ---------------------------------------------------------------------------------------------------- timing helpers
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
        t0 = time.perf_counter()
        loss = self.loss_fn(self.model, batch)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        sync(device)
        dt = time.perf_counter() - t0
        if probe:
            probe.__exit__(None, None, None)
            self.mem.append((probe.peak, probe.growth))
        if self.first_step_s is None:
            self.first_step_s = dt
        if record:
            self.times.append(dt)
        return dt


class GemmPeak:
    """fp32 GEMM throughput of the config's own shapes, F.linear like the model: x[B*S, H] @ W[4H, H]^T and
    x[B*S, 4H] @ W[H, 4H]^T (FFN in / out). `sample()` runs a few and keeps the per-shape medians."""

    def __init__(self, rows: int, H: int, I: int, device: torch.device) -> None:
        g = torch.Generator().manual_seed(0)
        self.device = device
        self.cases = []
        for k, n in ((H, I), (I, H)):
            x = torch.randn(rows, k, generator=g).to(device)
            w = torch.randn(n, k, generator=g).to(device)
            b = torch.randn(n, generator=g).to(device)
            self.cases.append((x, w, b, 2.0 * rows * k * n))
        self.samples: list[list[float]] = [[] for _ in self.cases]
        for _ in range(2):
            self.sample(2)  # warm-up

    def sample(self, n: int = 5) -> None:
        for i, (x, w, b, fl) in enumerate(self.cases):
            ts = []
            for _ in range(n):
                sync(self.device)
                t0 = time.perf_counter()
                F.linear(x, w, b)
                sync(self.device)
                ts.append(time.perf_counter() - t0)
            self.samples[i].append(fl / statistics.median(ts))

    def peak(self) -> float:
        """Median over rounds of each shape's rate; the faster shape is the peak."""
        return max(statistics.median(s) for s in self.samples if s)


# ---------------------------------------------------------------------------------------------------- models
def hf_config(cfg: BertConfig):
    import transformers

    d = cfg.to_dict()
    d.pop("architectures", None)
    return transformers.BertConfig(**d, attn_implementation="sdpa")


def build_pair(name: str, device: torch.device, seed: int = 0):
    """transformers' BertForPreTraining (its own init) and bertforge's loaded from it through a saved checkpoint."""
    import transformers

    cfg = BertConfig.preset(name, vocab_size=VOCAB)
    torch.manual_seed(seed)
    hf = transformers.BertForPreTraining(hf_config(cfg))
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours = bertforge.BertForPreTraining.from_pretrained(tmp)
    ours.set_attn_implementation("sdpa")
    return cfg, hf.to(device), ours.to(device)


def ours_loss(model, batch):
    return model(**batch).loss


def hf_loss(model, batch):
    return model(**batch).loss


def loss_check(hf, ours, batch) -> tuple[float, float]:
    """Same weights, same batch, eval mode (no dropout): |loss_bertforge - loss_transformers|."""
    hf.eval(), ours.eval()
    with torch.no_grad():
        a = float(hf_loss(hf, batch))
        b = float(ours_loss(ours, batch))
    hf.train(), ours.train()
    return a, b


# ---------------------------------------------------------------------------------------------------- prototype
class FastBert(torch.nn.Module):
    """Prototype of the recommended bertforge/model.py changes, run on a copy of a bertforge model (same weights,
    same maths; not part of the package). Options:

    unpad      dense layers, LayerNorm, dropout, GELU and embeddings run on the T real tokens [T, H] only
               (indices from the attention mask); q/k/v are scattered to [B, S, 3H] for SDPA and the context
               gathered back, so attention sees exactly what the padded model sees;
    fused_qkv  one persistent [3H, H] weight + [3H] bias per layer (no torch.cat of the three weights per call);
    bool_mask  SDPA gets a boolean [B, 1, 1, S] keep-mask instead of the additive float one.
    compile    torch.compile of the per-layer function (regional: one graph reused by every layer).
    """

    def __init__(self, ref: torch.nn.Module, unpad=True, fused_qkv=True, bool_mask=True, compile_layers=False):
        super().__init__()
        self.m = copy.deepcopy(ref)
        self.cfg = ref.config
        self.unpad, self.fused_qkv, self.bool_mask = unpad, fused_qkv, bool_mask
        if fused_qkv:
            for layer in self.m.bert.encoder.layer:
                sa = layer.attention.self
                sa.qkv_weight = torch.nn.Parameter(torch.cat([sa.query.weight, sa.key.weight, sa.value.weight]).detach())
                sa.qkv_bias = torch.nn.Parameter(torch.cat([sa.query.bias, sa.key.bias, sa.value.bias]).detach())
                del sa.query, sa.key, sa.value
        self.layer_fn = self._layer
        if compile_layers:
            self.layer_fn = torch.compile(self._layer, dynamic=None)

    def _qkv_params(self, sa):
        if self.fused_qkv:
            return sa.qkv_weight, sa.qkv_bias
        return (torch.cat([sa.query.weight, sa.key.weight, sa.value.weight]),
                torch.cat([sa.query.bias, sa.key.bias, sa.value.bias]))

    def _layer(self, layer, x, flat, mask, B: int, S: int, p: float, training: bool):
        cfg = self.cfg
        H, nh = cfg.hidden_size, cfg.num_attention_heads
        att = layer.attention
        w, b = self._qkv_params(att.self)
        qkv = F.linear(x, w, b)  # [T, 3H] or [B, S, 3H]
        if flat is not None:
            qkv = qkv.new_zeros(B * S, 3 * H).index_copy(0, flat, qkv)  # [B*S, 3H], zeros at padding
        q, k, v = qkv.view(B, S, 3, nh, H // nh).permute(2, 0, 3, 1, 4)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=cfg.attention_probs_dropout_prob if training else 0.0)
        ctx = ctx.transpose(1, 2).reshape(B * S, H)
        if flat is not None:
            ctx = ctx.index_select(0, flat)  # [T, H]
        else:
            ctx = ctx.view(B, S, H)
        out = F.dropout(att.output.dense(ctx), p, training)
        x = att.output.LayerNorm(out + x)
        h = F.gelu(layer.intermediate.dense(x)) if cfg.hidden_act == "gelu" else bertforge.model.activation(cfg.hidden_act, layer.intermediate.dense(x))
        h = F.dropout(layer.output.dense(h), p, training)
        return layer.output.LayerNorm(h + x)

    def forward(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label):
        cfg, m = self.cfg, self.m
        B, S = input_ids.shape
        emb = m.bert.embeddings
        p = cfg.hidden_dropout_prob
        padded = not bool(attention_mask.all())
        flat = attention_mask.reshape(-1).nonzero().squeeze(1) if (self.unpad and padded) else None
        if flat is not None:
            pos = torch.arange(S, device=input_ids.device).repeat(B)[flat]
            x = F.embedding(input_ids.reshape(-1)[flat], emb.word_embeddings.weight)
            x = x + F.embedding(pos, emb.position_embeddings.weight)
            x = x + F.embedding(token_type_ids.reshape(-1)[flat], emb.token_type_embeddings.weight)  # [T, H]
        else:
            x = emb.word_embeddings(input_ids) + emb.position_embeddings.weight[:S]
            x = x + emb.token_type_embeddings(token_type_ids)
        x = F.dropout(emb.LayerNorm(x), p, self.training)
        mask = None
        if padded:
            keep = attention_mask[:, None, None, :].bool()
            mask = keep if self.bool_mask else (1.0 - keep.to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in m.bert.encoder.layer:
            x = self.layer_fn(layer, x, flat, mask, B, S, p, self.training)
        # heads: [CLS] rows, labelled rows
        if flat is not None:
            lab = labels.reshape(-1)[flat]
            starts = torch.cumsum(attention_mask.sum(1), 0) - attention_mask.sum(1)  # row of each [CLS]
            cls_rows = x.index_select(0, starts)
        else:
            lab = labels.reshape(-1)
            x = x.reshape(B * S, -1)
            cls_rows = x.view(B, S, -1)[:, 0]
        keep_rows = (lab != -100).nonzero().squeeze(1)
        heads = m.cls
        logits = heads.predictions(x.index_select(0, keep_rows), emb.word_embeddings.weight)
        mlm = F.cross_entropy(logits, lab[keep_rows])
        pooled = torch.tanh(m.bert.pooler.dense(cls_rows))
        nsp = F.cross_entropy(heads.seq_relationship(pooled), next_sentence_label.reshape(-1))
        return mlm + nsp


def fast_loss(model, batch):
    return model(**batch)


def make_adamw(model, kind: str) -> torch.optim.Optimizer:
    if kind == "default":  # what bertforge.pretrain builds on CPU (fused only on CUDA) = for-loop on CPU
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
    print(f"\n=== {name}: batch {BATCH[name] if args.batch is None else args.batch} x seq {SEQ} ===", flush=True)
    t0 = time.perf_counter()
    cfg, hf, ours = build_pair(name, device)
    B = BATCH[name] if args.batch is None else args.batch
    n_enc = sum(p.numel() for n, p in ours.named_parameters() if ".encoder." in n)
    print(f"  params: {ours.num_parameters() / 1e6:.1f} M total, {n_enc / 1e6:.1f} M in the encoder "
          f"(built in {time.perf_counter() - t0:.1f} s)")
    rows = []
    for variant in args.variants:
        batch = {k: v.to(device) for k, v in make_batch(B, SEQ, packed=(variant == "packed")).items()}
        real = int(batch["attention_mask"].sum())
        total = B * SEQ
        n_lab = int((batch["labels"] != -100).sum())
        fl = step_flops(cfg, batch)
        a, b = loss_check(hf, ours, batch)
        print(f"  [{variant}] real tokens {real}/{total} ({real / total:.1%}), labelled {n_lab}; "
              f"loss check (eval, same weights): transformers {a:.6f} bertforge {b:.6f} |diff| {abs(a - b):.2e} "
              f"({'within' if abs(a - b) <= 1e-4 else 'OUTSIDE'} 1e-4)", flush=True)
        # fresh optimizers per variant; models keep training from where they are (timing only)
        r_ours = Runner("bertforge", ours, ours_loss, make_adamw(ours, args.optimizer), fl.ours)
        r_hf = Runner("transformers", hf, hf_loss, make_adamw(hf, args.optimizer), fl.hf)
        gemm = GemmPeak(total, cfg.hidden_size, cfg.intermediate_size, device)
        interleave([r_ours, r_hf], batch, device, args.warmup, args.repeats, gemm)
        peak = gemm.peak()
        for r in (r_ours, r_hf):
            t = med(r.times)
            rows.append(dict(config=name, variant=variant, impl=r.name, ms=t * 1e3, real_tps=real / t,
                             total_tps=total / t, mfu=fl.useful / t / peak, hfu=r.flops_exec / t / peak,
                             peak_gflops=peak / 1e9, mem_peak=r.mem[0][0], mem_growth=r.mem[0][1],
                             speedup=ratio(r_hf, r_ours) if r is r_ours else 1.0,
                             spread=(min(r.times) * 1e3, max(r.times) * 1e3)))
        del r_ours, r_hf
    if args.profile:
        profile_step(ours, ours_loss, make_adamw(ours, args.optimizer),
                     {k: v.to(device) for k, v in make_batch(B, SEQ, packed=False).items()}, device, args.profile_rows)
    return rows


def print_table(rows: list[dict]) -> None:
    print("\nheadline: real (non-padding) tokens/s; 'pos/s' counts every position (B*S) including padding.")
    print("MFU = useful FLOPs / time / peak (same useful count for both); HFU = FLOPs the implementation executes"
          " / time / peak; peak = median fp32 GEMM GFLOP/s of the config's FFN shapes, measured in the same rounds.")
    hdr = (f"{'config':7} {'batch':7} {'impl':13} {'ms/step':>8} {'(min-max)':>13} {'real tok/s':>11} {'pos/s':>8} "
           f"{'x HF':>6} {'MFU':>6} {'HFU':>6} {'peak GF/s':>9} {'RSS peak':>10} {'step +RSS':>10}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['config']:7} {r['variant']:7} {r['impl']:13} {r['ms']:8.0f} {r['spread'][0]:6.0f}-{r['spread'][1]:<6.0f} "
              f"{r['real_tps']:11,.0f} {r['total_tps']:8,.0f} {r['speedup']:6.2f} {r['mfu']:6.1%} {r['hfu']:6.1%} "
              f"{r['peak_gflops']:9.1f} {fmt_bytes(r['mem_peak']):>10} {fmt_bytes(r['mem_growth']):>10}")


# ---------------------------------------------------------------------------------------------------- profile
CATEGORIES = [
    ("matmul (linear/mm/addmm/bmm)", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")),
    ("attention (SDPA fwd+bwd)", ("scaled_dot_product", "flash_attention")),
    ("optimizer (AdamW)", ("adam", "_foreach", "aten::lerp", "aten::addcdiv", "aten::addcmul", "aten::sqrt", "aten::_fused")),
    ("layer norm", ("layer_norm",)),
    ("gelu", ("gelu",)),
    ("dropout / RNG", ("dropout", "bernoulli")),
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


def profile_step(model, loss_fn, opt, batch, device, top: int, title: str = "bertforge") -> None:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):  # warm
        loss_fn(model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=acts, record_shapes=False) as prof:
        loss_fn(model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
    wall = time.perf_counter() - t0
    ka = prof.key_averages()
    print(f"\n--- profile: one {title} training step (padded batch), wall {wall * 1e3:.0f} ms under the profiler ---")
    print(ka.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=60))
    total = sum(e.self_cpu_time_total for e in ka)
    cats: dict[str, float] = {}
    for e in ka:
        cats[categorize(e.key)] = cats.get(categorize(e.key), 0.0) + e.self_cpu_time_total
    print("self CPU time by category (share of the step's self CPU time):")
    for k, v in sorted(cats.items(), key=lambda kv: -kv[1]):
        print(f"  {k:34} {v / 1e3:9.1f} ms  {v / total:6.1%}")


# ---------------------------------------------------------------------------------------------------- experiments
def experiments(name: str, args, device: torch.device) -> None:
    """A/B of candidate changes against current bertforge, each pair interleaved step by step on the padded batch
    (and on the packed batch for the combined prototype). Every prototype's loss is checked against bertforge's."""
    print(f"\n=== experiments: {name} ===", flush=True)
    cfg, hf, ours = build_pair(name, device)
    del hf
    B = BATCH[name] if args.batch is None else args.batch
    padded = {k: v.to(device) for k, v in make_batch(B, SEQ, packed=False).items()}
    packed = {k: v.to(device) for k, v in make_batch(B, SEQ, packed=True).items()}
    fl = step_flops(cfg, padded)
    fl_unpad = step_flops(cfg, padded, unpadded=True)
    gemm = GemmPeak(B * SEQ, cfg.hidden_size, cfg.intermediate_size, device)

    def check(proto, batch) -> float:
        ours.eval(), proto.eval()
        with torch.no_grad():
            d = abs(float(ours_loss(ours, batch)) - float(fast_loss(proto, batch)))
        ours.train(), proto.train()
        return d

    cases: list[tuple[str, Callable[[], Runner], dict]] = []

    def proto(label, batch=padded, opt="default", **kw):
        def build():
            p = FastBert(ours, **kw).to(device)
            d = check(p, batch)
            print(f"    {label}: |loss - bertforge loss| (eval) = {d:.2e}")
            unp = kw.get("unpad", True) and batch is padded
            return Runner(label, p, fast_loss, make_adamw(p, opt), (fl_unpad if unp else fl).ours)
        cases.append((label, build, batch))

    base_kw = dict(unpad=False, fused_qkv=False, bool_mask=False)
    wanted = set(args.experiment_list)
    if "equiv" in wanted:  # the prototype with every option off = bertforge's maths in a different file (control)
        proto("proto-control", **base_kw)
    if "unpad" in wanted:
        proto("unpad", **{**base_kw, "unpad": True})
    if "fused_qkv" in wanted:
        proto("fused-qkv", **{**base_kw, "fused_qkv": True})
    if "bool_mask" in wanted:
        proto("bool-mask", **{**base_kw, "bool_mask": True})
    if "optim" in wanted:
        for kind in ("foreach", "fused"):
            cases.append((f"adamw-{kind}", (lambda k=kind: Runner(f"adamw-{k}", copy.deepcopy(ours), ours_loss,
                                                                   None, fl.ours)), padded))
    if "all" in wanted:
        proto("all(unpad+qkv+bool)+fused-adamw", opt="fused")
        proto("all, packed batch", batch=packed, opt="fused")
    if "compile" in wanted:
        proto("all+compile+fused-adamw", opt="fused", compile_layers=True)

    for label, build, batch in cases:
        print(f"  -- {label} vs bertforge ({'packed' if batch is packed else 'padded'} batch)", flush=True)
        r = build()
        if r.opt is None:
            r.opt = make_adamw(r.model, label.split("-", 1)[1])
        base = Runner("bertforge", ours, ours_loss, make_adamw(ours, "default"), fl.ours)
        t0 = time.perf_counter()
        r.step(batch, device, record=False)
        first = time.perf_counter() - t0
        interleave([base, r], batch, device, args.warmup, args.repeats, gemm, log=lambda *a, **k: None)
        peak = gemm.peak()
        real = int(batch["attention_mask"].sum())
        flu = step_flops(cfg, batch).useful
        tb, tr = med(base.times), med(r.times)
        print(f"     bertforge {tb * 1e3:7.0f} ms  {real / tb:9,.0f} tok/s  MFU {flu / tb / peak:6.1%}   |   "
              f"{label} {tr * 1e3:7.0f} ms  {real / tr:9,.0f} tok/s  MFU {flu / tr / peak:6.1%}   "
              f"speed-up x{ratio(base, r):.3f}  (first step {first:.1f} s; peak {peak / 1e9:.0f} GF/s)", flush=True)
        del r, base

    if "threads" in wanted:
        n0 = torch.get_num_threads()
        for n in sorted({1, n0}):
            torch.set_num_threads(n)
            r = Runner(f"threads={n}", ours, ours_loss, make_adamw(ours, "default"), fl.ours)
            for _ in range(args.warmup):
                r.step(padded, device, record=False)
            for _ in range(args.repeats):
                r.step(padded, device, record=True)
            t = med(r.times)
            print(f"  -- threads={n}: {t * 1e3:.0f} ms/step, {int(padded['attention_mask'].sum()) / t:,.0f} tok/s")
        torch.set_num_threads(n0)

    if args.profile:
        p = FastBert(ours, compile_layers=False).to(device)
        profile_step(p, fast_loss, make_adamw(p, "fused"), padded, device, args.profile_rows,
                     title="prototype (unpad+fused-qkv+bool-mask, fused AdamW)")


# ---------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="mini,small,base", help="comma-separated presets (default: mini,small,base)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--repeats", type=int, default=5, help="measured interleaved rounds (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up steps per implementation (default 2)")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch.get_num_threads())")
    ap.add_argument("--batch", type=int, default=None, help="override the batch size (default 16; 8 for base)")
    ap.add_argument("--variants", default="padded,packed", help="padded, packed or both (default both)")
    ap.add_argument("--optimizer", default="default", choices=["default", "foreach", "fused"],
                    help="AdamW implementation for the main comparison (default: make_optimizer's, for-loop on CPU)")
    ap.add_argument("--profile", action="store_true", help="print the top ops of one bertforge step")
    ap.add_argument("--profile-rows", type=int, default=25)
    ap.add_argument("--experiments", action="store_true", help="A/B candidate speed-ups instead of the main table")
    ap.add_argument("--experiment-list", default="unpad,fused_qkv,bool_mask,optim,all,compile,threads",
                    help="subset of: equiv,unpad,fused_qkv,bool_mask,optim,all,compile,threads")
    args = ap.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    args.experiment_list = [v for v in args.experiment_list.split(",") if v]
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
        torch.backends.cudnn.allow_tf32 = False
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device}, "
          f"threads {torch.get_num_threads()} (os.cpu_count {os.cpu_count()}), fp32, train mode (dropout on)")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if device.type == "cpu" and not _reset_hwm():
        print("note: /proc/self/clear_refs not writable: CPU memory is ru_maxrss, a whole-process high-water mark")
    rows: list[dict] = []
    for name in [c for c in args.configs.split(",") if c]:
        if args.experiments:
            experiments(name, args, device)
        else:
            rows.extend(run_config(name, args, device))
    if rows:
        print_table(rows)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
