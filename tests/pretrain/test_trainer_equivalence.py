"""Pretraining options that must not change the maths, compared step by step with one fp32 eager process on the
same rows: gradient checkpointing (bitwise), `--compile`, bf16 autocast, gradient accumulation, DDP and FSDP over
two CPU processes. Each bar is stated beside the value measured on this project's 2-core CPU machine. Every option
is also shown to take effect (recomputed layers, a compiled graph, bf16 arithmetic), so that an option silently
ignored cannot pass as "the same maths"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertforge.pretrain.trainer import PretrainArgs, Pretrainer
from bertforge.pretrain.data import pretraining_stream
from tests.helpers import count_graphs, tiny_run_args

NO_DROPOUT = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(scope="module")
def inputs(corpus_and_tokenizer, tmp_path_factory):  # noqa: F811
    """(corpus, tokenizer, config with dropout, config without): without dropout, runs that draw random numbers in
    other shapes or orders (compiled code, other batch splits, other processes) can be compared."""
    corpus, tok, config = corpus_and_tokenizer
    plain = tmp_path_factory.mktemp("equivalence") / "config-no-dropout.json"
    plain.write_text(json.dumps(NO_DROPOUT))
    return corpus, tok, config, plain


@pytest.fixture
def one_thread():
    """One intra-op thread (the torchrun workers run with OMP_NUM_THREADS=1 too): the same GEMM blocking on both
    sides, and no oversubscribed OpenMP pool on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def settings(inputs, out: Path, dropout: bool = True, **kw) -> PretrainArgs:
    corpus, tok, config, plain = inputs
    return tiny_run_args((corpus, tok, config if dropout else plain), out, **{
        "max_steps": 3, "lr": 1e-3, "warmup_steps": 0, "decay": "constant", "device": "cpu", **kw})


def train(args: PretrainArgs, steps: int, rows: list[dict] | None = None) -> tuple[Pretrainer, list[dict], dict]:
    """`steps` optimizer steps through `Pretrainer.train_step` (on `rows`, one micro-batch each, when given; else on
    the run's own data stream). Returns the trainer, what each step returned and the weights after."""
    trainer = Pretrainer(args)
    if rows is not None:
        trainer.stream = iter(rows)
    results = [trainer.train_step() for _ in range(steps)]
    return trainer, results, {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def largest_gap(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def losses(results: list[dict]) -> list[float]:
    return [r["loss"] for r in results]


# ---------------------------------------------------------------------------------------------------- checkpointing
def test_gradient_checkpointing_gives_bitwise_the_same_steps(inputs, tmp_path, one_thread):
    """The same maths recomputed in backward, dropout masks included (the RNG state is replayed): measured bitwise
    equal (loss and weight gaps 0.0 with dropout 0.1 and without), so the bar is equality."""
    _, eager, w_eager = train(settings(inputs, tmp_path / "eager"), 3)
    _, ckpt, w_ckpt = train(settings(inputs, tmp_path / "ckpt", gradient_checkpointing=True), 3)
    assert losses(ckpt) == losses(eager)
    assert [r["grad_norm"] for r in ckpt] == [r["grad_norm"] for r in eager]
    assert largest_gap(w_ckpt, w_eager) == 0.0
    assert len(set(losses(eager))) == 3  # three different batches, weights that moved between them


def layer_calls(trainer: Pretrainer) -> list[int]:
    """How many times each encoder layer's forward starts during one training step (a pre-hook: the recomputation
    in backward stops as soon as it has rebuilt what backward needs, so the layer's forward never returns there)."""
    layers = trainer.model.bert.encoder.layer
    calls = [0] * len(layers)
    handles = [layer.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
               for i, layer in enumerate(layers)]
    try:
        trainer.train_step()
    finally:
        for h in handles:
            h.remove()
    return calls


def saved_bytes(trainer: Pretrainer) -> int:
    """Bytes of the tensors autograd keeps from forward for backward over one training step (the activations that
    gradient checkpointing is there to drop; tensors saved inside a checkpointed region are not kept)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        trainer.train_step()
    return total


def test_gradient_checkpointing_takes_effect(inputs, tmp_path, one_thread):
    """With the flag each layer runs twice per step (forward, then again in backward) and autograd keeps fewer
    activations; without it, once. Measured on this tiny model (batch 4, seq 32): 2 calls against 1, and
    118,504 bytes saved against 811,752 (a ratio of 0.15; bar 1/3)."""
    eager = Pretrainer(settings(inputs, tmp_path / "eager", max_steps=4))
    ckpt = Pretrainer(settings(inputs, tmp_path / "ckpt", max_steps=4, gradient_checkpointing=True))
    assert layer_calls(eager) == [1, 1] and layer_calls(ckpt) == [2, 2]
    kept, full = saved_bytes(ckpt), saved_bytes(eager)
    print(f"saved for backward: {kept} bytes with checkpointing, {full} without")
    assert kept < full / 3, (kept, full)


# ---------------------------------------------------------------------------------------------------- compile
def compiled_run(inputs, out: Path, monkeypatch, backend: str | None) -> tuple[list[dict], dict, int]:
    """A `compile=True` run of 3 steps; `backend` replaces inductor (None keeps it). Returns the steps, the
    weights and the number of graphs the backend compiled."""
    graphs = count_graphs(monkeypatch, backend)
    trainer, results, weights = train(settings(inputs, out, dropout=False, compile=True), 3)
    assert isinstance(trainer.train_model, torch._dynamo.eval_frame.OptimizedModule)
    return results, weights, len(graphs)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param(None, marks=pytest.mark.slow, id="inductor")])
def test_compile_follows_eager(inputs, tmp_path, monkeypatch, one_thread, backend):
    """`--compile` traced by dynamo and AOTAutograd (`aot_eager`: the graphs the compiler gets, run by eager
    kernels; a few seconds) and with inductor's generated code (slow: ~100 s of compiling on a loaded 2-core
    machine, cached afterwards). Without dropout (compiled code draws its own masks). Measured: aot_eager
    loss gap 0 / weight gap 2.2e-8, inductor loss gap 4.8e-7 to 9.5e-7 / weight gap 5.5e-7 to 1.2e-6 (losses of 5.5);
    bars 5e-6 for both."""
    _, eager, w_eager = train(settings(inputs, tmp_path / "eager", dropout=False), 3)
    compiled, w_compiled, graphs = compiled_run(inputs, tmp_path / "compiled", monkeypatch, backend)
    assert graphs >= 1  # the model really went through the compiler
    loss_gap = max(abs(a - b) for a, b in zip(losses(compiled), losses(eager)))
    weight_gap = largest_gap(w_compiled, w_eager)
    print(f"compile ({backend or 'inductor'}): {graphs} graphs, loss gap {loss_gap:.2e}, weight gap {weight_gap:.2e}")
    assert loss_gap <= 5e-6 and weight_gap <= 5e-6, (loss_gap, weight_gap)


@pytest.mark.parametrize("preset", [pytest.param("modernbert-tiny", marks=pytest.mark.slow), "deberta-v3-tiny"])
def test_compile_follows_eager_for_the_new_families(inputs, tmp_path, monkeypatch, one_thread, preset):
    """`--compile` (aot_eager) on ModernBERT (its recipe: documents packed and attended within themselves, alternating
    local and global attention, rotary positions) and on DeBERTa-v3 (replaced-token detection: the generator and the
    discriminator, relative attention), without dropout. Measured: ModernBERT loss and weight gaps 0.0; DeBERTa-v3
    loss gap 0.0, weight gap 1.5e-7 to 1.8e-7 (losses of 35-39: the RTD loss weighs 50); bars 5e-6. ModernBERT's
    case is slow (16 graphs: ~20 s of tracing on an idle 2-core machine)."""
    from bertforge import BertConfig

    config = BertConfig.preset(preset).to_dict()
    config.update({k: 0.0 for k, v in config.items() if "dropout" in k and isinstance(v, float)})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    family = (inputs[0], inputs[1], path, path)
    _, eager, w_eager = train(settings(family, tmp_path / "eager"), 3)
    graphs = count_graphs(monkeypatch, "aot_eager")
    trainer, compiled, w_compiled = train(settings(family, tmp_path / "compiled", compile=True), 3)
    assert isinstance(trainer.train_model, torch._dynamo.eval_frame.OptimizedModule) and len(graphs) >= 1
    assert trainer.model.config.model_type == BertConfig.preset(preset).model_type
    loss_gap = max(abs(a - b) for a, b in zip(losses(compiled), losses(eager)))
    weight_gap = largest_gap(w_compiled, w_eager)
    print(f"compile {preset}: {len(graphs)} graphs, loss gap {loss_gap:.2e}, weight gap {weight_gap:.2e}")
    assert loss_gap <= 5e-6 and weight_gap <= 5e-6, (loss_gap, weight_gap)
    assert len(set(losses(eager))) == 3


# ---------------------------------------------------------------------------------------------------- bf16
def dense_output_dtypes(trainer: Pretrainer) -> set[torch.dtype]:
    """The dtypes the model's dense layers (every matrix multiply with a weight) produce during one training step."""
    from bertforge.model import Dense

    seen: set[torch.dtype] = set()
    handles = [m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
               for m in trainer.model.modules() if isinstance(m, Dense)]
    try:
        trainer.train_step()
    finally:
        for h in handles:
            h.remove()
    return seen


def test_bf16_autocast_stays_near_fp32(inputs, tmp_path, one_thread):
    """bf16 autocast on CPU (3 steps of a tiny model: on a CPU without bf16 units it is emulated, many times slower): every dense layer
    computes in bf16, and the losses follow fp32 within 3e-3 on losses of 5.5. Measured, over eight runs (the test
    tokenizer differs from process to process): largest gap 1.7e-4 to 8.6e-4, first-step gap (same weights, same
    batch: bf16's rounding alone) 8e-6 to 1.5e-4. The weights are not compared: after an Adam step of lr 1e-3 a
    bf16-rounded gradient of the other sign moves a weight by 2 x lr, so weight gaps of ~2e-3 say nothing."""
    _, fp32, _ = train(settings(inputs, tmp_path / "fp32", dropout=False), 3)
    eager = Pretrainer(settings(inputs, tmp_path / "probe-fp32", dropout=False))
    assert dense_output_dtypes(eager) == {torch.float32}
    trainer = Pretrainer(settings(inputs, tmp_path / "bf16", dropout=False, precision="bf16"))
    assert trainer.autocast_dtype == torch.bfloat16
    bf16 = [trainer.train_step() for _ in range(3)]
    assert dense_output_dtypes(trainer) == {torch.bfloat16}  # a fourth step, watched
    gaps = [abs(a - b) for a, b in zip(losses(bf16), losses(fp32))]
    print(f"bf16 - fp32 loss gaps {[f'{g:.2e}' for g in gaps]}")
    assert max(gaps) <= 3e-3, gaps
    assert max(gaps) > 0.0


# ---------------------------------------------------------------------------------------------------- same rows, split
STEPS = 2


@pytest.fixture(scope="module")
def global_rows(inputs, tmp_path_factory) -> list[dict[str, torch.Tensor]]:
    """STEPS global batches of 4 masked rows from the run's own data stream (NSP pairs, dynamic masking), all
    padded to one length. Full rows of this corpus all get the same number of labelled tokens (4), so in the first
    row of each batch all labels but one are undone (the original token back in place, label -100): the halves
    (rows 0-1, rows 2-3) then hold 5 and 8 labelled tokens, and averaging the loss per micro-batch (or per rank)
    differs from averaging it over the batch."""
    probe = Pretrainer(settings(inputs, tmp_path_factory.mktemp("rows") / "probe", dropout=False))
    rows = next(pretraining_stream(probe.args, probe.corpus, probe.tokenizer, 0, 1, 4 * STEPS))
    batches = []
    for step in range(STEPS):
        batch = {k: v[4 * step:4 * step + 4].clone() for k, v in rows.items()}
        ids, labels = batch["input_ids"][0], batch["labels"][0]
        undo = (labels != -100).nonzero().flatten()[1:]
        ids[undo], labels[undo] = labels[undo], -100
        counts = (batch["labels"] != -100).sum(1).tolist()
        assert counts[0] == 1 and sum(counts[:2]) != sum(counts[2:]), counts
        batches.append(batch)
    return batches


def split(batch: dict[str, torch.Tensor], parts: int) -> list[dict[str, torch.Tensor]]:
    n = len(batch["input_ids"]) // parts
    return [{k: v[p * n:(p + 1) * n] for k, v in batch.items()} for p in range(parts)]


def compare(name: str, got: tuple[list[dict], dict], want: tuple[list[dict], dict]) -> tuple[float, float, float]:
    """(largest loss gap, largest relative grad-norm gap, largest weight gap) between two runs of the same steps.
    The grad norm (before clipping) is what sees a gradient scaled by a constant: Adam's update barely does."""
    (r_got, w_got), (r_want, w_want) = got, want
    loss_gap = max(abs(a["loss"] - b["loss"]) for a, b in zip(r_got, r_want))
    norm_gap = max(abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(r_got, r_want))
    weight_gap = largest_gap(w_got, w_want)
    print(f"{name}: loss gap {loss_gap:.2e}, grad-norm gap {norm_gap:.2e} (relative), weight gap {weight_gap:.2e}")
    return loss_gap, norm_gap, weight_gap


@pytest.fixture(scope="module")
def one_process_batch_of_four(inputs, global_rows, tmp_path_factory):
    """The reference: one process, one micro-batch of 4 rows per step, fp32 eager, one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _, results, weights = train(settings(inputs, tmp_path_factory.mktemp("ref") / "run", dropout=False,
                                             batch_size=4, max_steps=STEPS), STEPS, global_rows)
    finally:
        torch.set_num_threads(before)
    return results, weights


def test_gradient_accumulation_equals_the_whole_batch(inputs, tmp_path, global_rows, one_process_batch_of_four,
                                                      one_thread):
    """grad_accum 2 x batch 2 against batch 4 on the same rows: the same gradient (the loss averaged over all the
    step's labelled tokens, not per micro-batch), so the same grad norm and weights."""
    micro = [half for batch in global_rows for half in split(batch, 2)]
    _, results, weights = train(settings(inputs, tmp_path / "accum", dropout=False, batch_size=2, grad_accum=2,
                                         max_steps=STEPS), STEPS, micro)
    loss_gap, norm_gap, weight_gap = compare("grad_accum 2 x 2 vs 4", (results, weights), one_process_batch_of_four)
    # measured 4.8e-7 on a loss of 5.5, 7.9e-8, 1.6e-7 (averaged per micro-batch, as before: 8.3e-3, 3.5e-2, 3.9e-3)
    assert loss_gap <= 2e-6 and norm_gap <= 1e-6 and weight_gap <= 1e-6


@pytest.fixture(scope="module")
def two_processes(inputs, global_rows, tmp_path_factory):
    """One `torchrun --nproc-per-node 2` (gloo, CPU, one thread each) running the same STEPS under DDP and then
    under FSDP, each rank on its half of every global batch; {mode: (steps, weights)} from rank 0."""
    corpus, tok, _, plain = inputs
    root = tmp_path_factory.mktemp("two")
    rows = {k: torch.stack([b[k] for b in global_rows]) for k in global_rows[0]}
    save_file({k: v.contiguous() for k, v in rows.items()}, str(root / "rows.safetensors"))
    spec = dict(rows=str(root / "rows.safetensors"), out=str(root), modes=["ddp", "fsdp"],
                args=dict(corpus=[str(corpus)], tokenizer=str(tok), config=str(plain), max_steps=STEPS, batch_size=2,
                          max_length=32, lr=1e-3, warmup_steps=0, decay="constant", progress=False, demo=False,
                          device="cpu"))
    (root / "spec.json").write_text(json.dumps(spec))
    worker = Path(__file__).parent / "rows_worker.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(worker),
           str(root / "spec.json")]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    except subprocess.TimeoutExpired:
        pytest.fail("torchrun with the two-process equivalence worker hung for 300 s")
    assert done.returncode == 0, done.stderr[-3000:]
    return {mode: (json.loads((root / mode / "steps.json").read_text()), load_file(str(root / mode / "weights.safetensors")))
            for mode in spec["modes"]}


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_equal_one_on_the_same_rows(two_processes, one_process_batch_of_four, mode):
    """2 processes x batch 2 (DDP, or FSDP with --fsdp) against one process x batch 4 on the same rows: the
    gradients are averaged over both ranks' labelled tokens, so grad norm and weights are the one process's."""
    loss_gap, norm_gap, weight_gap = compare(f"{mode} 2 x 2 vs 4", two_processes[mode], one_process_batch_of_four)
    # measured 4.8e-7 on a loss of 5.5, 7.9e-8, 1.6e-7 (FSDP 1.2e-7); averaged per rank, as before: 8.3e-3, 3.5e-2, 3.9e-3
    assert loss_gap <= 2e-6 and norm_gap <= 1e-6 and weight_gap <= 1e-6
