"""The Python API behind `bertforge finetune`, `bertforge evaluate` and `bertforge predict`."""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import math
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..model.card import ModelCard
from ..model.config import BertConfig
from ..data.corpus import calibration_ids
from ..core.errors import BertforgeError
from ..core.io import atomic_directory, atomic_write_text, check_output_file, json_line
from ..model.memory import check_training_fits
from ..model.quantize import check_quantize, quantize_model
from ..training.adapters import save_trained
from ..training.run_dir import RunDirectory, RunKind
from ..training.step import refuse_nonfinite
from ..training.checkpoint import TrainingCheckpoints
from ..training.loop import RunLifecycle, open_metrics
from .config import DataOptions, FinetuneConfig
from .tasks import Encoded, Task, get_task
from ..core.system import Runtime, from_main, on_every_rank, on_main, setup_runtime, teardown_runtime
from .trainer import plot_curve, run_logged, run_model
from ..core.hub import model_reference
from ..data.tables import InMemory, in_memory, is_path, split_in_memory

log = logging.getLogger("bertforge")

RUN_MARKER = "finetune_config.json"  # the file that marks a directory as a finetune run's output
# A fine-tuning run's directory: what --overwrite replaces, and the settings a --resume may change (the others
# would make the continuation a different run; `out` is where the run lives, not what it is)
FINETUNING = RunKind(
    command="finetune", what="fine-tuning run", config_file=RUN_MARKER,
    entries=("checkpoints", "model", "tensorboard", "metrics.jsonl", "eval.json", "training_curve.png", RUN_MARKER),
    resumable=frozenset({"out", "resume", "overwrite", "progress", "save_every", "keep_checkpoints", "log_every",
                         "max_skipped_steps", "versions"}),
)
HEAD_PREFIXES = ("classifier.", "qa_outputs.")


def finetune(config: FinetuneConfig | None = None, **settings: Any) -> dict[str, Any]:
    """Fine-tune a pretrained model on a task and write the run's directory.

    Pass a `FinetuneConfig`, or its fields as keywords: `finetune(task="ner", model=..., train=..., dev=...,
    out=..., epochs=2)`. For every task, `train` and `dev` may also be rows in memory (a list of dicts, a dict
    of lists, a `datasets.Dataset`: `bertforge.data.tables`), which `finetune_config.json` records as
    `<in-memory: N rows, sha256 …>` (such a run resumes, but cannot be replayed from that file). Everything is
    read and checked before `out` changes. `out` holds:

    * `model/` — the best checkpoint and its tokenizer, in the Hugging Face layout (`id2label` / `label2id` in
      config.json), loadable by `transformers`' `BertFor...` class of the task;
    * `eval.json` — the dev metrics of the best evaluation (written last: the run is complete when it is there);
      `metrics.jsonl` — every training-loss record and evaluation; `tensorboard/` — the same as TensorBoard
      scalars; `training_curve.png`; `finetune_config.json` — the settings, which repeat the run;
    * `checkpoints/step-N/` — the newest `keep_checkpoints` checkpoints (at each epoch's end, where early stopping
      ends the run, and every `save_every` steps): `resume=True` continues a run that was stopped from the newest
      one, ending as if it had never stopped. `overwrite=True` keeps the run it replaces aside until the new run's
      first checkpoint.

    Under `torchrun --nproc-per-node N` each process trains on its share of every batch of `batch_size` (the
    global batch: the run takes the steps of one process with that batch), and rank 0 alone evaluates and writes.

    Returns the contents of `eval.json` (on every rank; `train_seconds` by its own clock).
    """
    cfg = config if config is not None else make_settings(FinetuneConfig, settings)
    cfg, rows = split_in_memory(cfg, ("train", "dev"))  # rows in memory: the settings record a description
    cfg.validate()
    rt = setup_runtime(cfg.device)  # before anything is read or written; joins torchrun's process group
    cfg = dataclasses.replace(cfg, model=model_reference(cfg.model), **{
        k: str(Path(getattr(cfg, k)).resolve()) for k in ("train", "dev", "out") if k not in rows})
    out = Path(cfg.out)
    lifecycle = RunLifecycle(RunDirectory(out, cfg.resume, cfg.overwrite, saved_settings(cfg), FINETUNING), rt)
    # a failure puts back a run --overwrite set aside (before this one's first checkpoint); the lock goes either way
    with lifecycle.guarded():
        # a second run into `out` is refused while this one runs
        lifecycle.lock(lifecycle.run_dir.refuse_foreign)
        summary = _finetune(cfg, out, rt, lifecycle, rows)
    gc.collect()  # the DDP wrapper (in a reference cycle, maybe) lets go of the process group first
    teardown_runtime(rt)  # on success only: after an error, other ranks may still be inside a collective
    return summary


def saved_settings(cfg: FinetuneConfig) -> dict[str, Any]:
    """What `finetune_config.json` records: the settings, as a new run repeats them (not --resume, --overwrite),
    and the versions that wrote it (information only)."""
    return {**cfg.to_dict(), "resume": False, "overwrite": False,
            "versions": {"bertforge": __version__, "torch": torch.__version__}}


def _finetune(cfg: FinetuneConfig, out: Path, rt: Runtime, lifecycle: RunLifecycle,
              rows: dict[str, InMemory] | None = None) -> dict[str, Any]:
    task = get_task(cfg.task)
    opts = cfg.data_options()
    # read, encode and size the run on every rank: a refusal on one rank is one on all
    tokenizer, main_metric, train_data, dev_data, model = on_every_rank(
        rt, lambda: _build_run(cfg, task, opts, rt, rows or {}))

    def evaluate_dev() -> dict[str, Any]:  # rank 0 scores, every rank learns the metrics (the same decisions)
        return from_main(rt, lambda: _score(task, model, dev_data, opts, tokenizer.pad_token_id, rt.device))

    run = task.training(model, train_data, evaluate_dev, cfg, main_metric, tokenizer, rt)
    run.enable_checkpoints(TrainingCheckpoints(out, rt, run.stepper, cfg.keep_checkpoints, model.config), cfg.save_every)
    lifecycle.prepare()  # the first change to `out`
    resumed = cfg.resume and run.resume()
    metrics = open_metrics(out, cfg.resume, resumed, run.stepper.step, enabled=rt.is_main)
    result = run_logged(run, metrics, "fine-tuning", lifecycle)
    run.train_model = model  # DDP's wrapper goes (see `finetune`)
    lifecycle.checkpointed()  # (done at the first checkpoint already)
    assert result.best is not None  # every run evaluates at least once
    summary = {
        "task": cfg.task,
        "dev": cfg.dev,
        "main_metric": main_metric,
        "epoch": result.best.epoch,
        "step": result.best.step,
        "metrics": result.best.metrics,
        "train_steps": result.steps,
        "train_seconds": round(result.seconds, 2),
        "stopped_early": result.stopped_early,
    }
    on_main(rt, lambda: _write_run(cfg, out, model, tokenizer, result.best, summary))
    return summary


def _build_run(cfg: FinetuneConfig, task: Task, opts: DataOptions, rt: Runtime,
               rows: dict[str, InMemory]) -> tuple[Any, ...]:
    """The tokenizer, the main metric, the encoded training and dev data (from `rows` in memory, or the files),
    and the model (its new head initialised from the seed), each checked: the memory estimate before the model is
    built."""
    tokenizer = _load_tokenizer(cfg.model)
    train_examples, _ = task.read(rows.get("train", cfg.train), opts, labelled=True)
    dev_examples, _ = task.read(rows.get("dev", cfg.dev), opts, labelled=True)
    overrides = {**task.label_overrides(train_examples, Path(cfg.train)), "finetuning_task": cfg.task}
    model_config = BertConfig.from_pretrained(cfg.model, **overrides)
    main_metric = task.main_metric(model_config, cfg.metric)
    train_data = task.encode(tokenizer, train_examples, opts, model_config, Path(cfg.train), labelled=True)
    task.check_trainable(train_data)
    dev_data = task.encode(tokenizer, dev_examples, opts, model_config, Path(cfg.dev), labelled=True)

    seq_len = task.max_length(opts, model_config)
    # each rank's share of the global batch, against its own device (every rank of a run holds the same model)
    sequences = math.ceil(cfg.batch_size / rt.world_size) * task.sequences_per_example(train_examples, cfg)
    check_training_fits(model_config, sequences, seq_len, rt.device,
                        head="classification", what=f"fine-tuning {cfg.model}")  # before the model is built
    torch.manual_seed(cfg.seed)  # the new head's initialisation and dropout (the same head on every rank)
    # a checkpoint fine-tuned for other labels gets a new head (with a warning that names it, from rank 0)
    model = task.model_class.from_pretrained(cfg.model, ignore_mismatched_sizes=True, quiet=not rt.is_main,
                                             **overrides)
    return tokenizer, main_metric, train_data, dev_data, model


def _write_run(cfg: FinetuneConfig, out: Path, model: Any, tokenizer: Any, best: Any, summary: dict[str, Any]) -> None:
    """Rank 0's end of the run: OUT/model (the best weights), the training curve, and eval.json last."""
    refuse_nonfinite(model.state_dict(), str(out / "model"))
    with atomic_directory(out / "model") as work:
        recipe = {k: getattr(cfg, k) for k in ("task", "epochs", "batch_size", "lr", "max_length", "seed")}
        save_trained(model, work, cfg, cfg.model, ModelCard(
            base_model=cfg.model, datasets=(cfg.train,), recipe=recipe, metrics=best.metrics, trained_by="finetune",
            metrics_on=f"`{cfg.dev}` (the best evaluation: step {best.step}, epoch {best.epoch})"))
        tokenizer.save_pretrained(work)
        get_task(cfg.task).save_files(work, {"bertforge": __version__, "torch": torch.__version__})
    with open(out / "metrics.jsonl", encoding="utf-8") as records:
        plot_curve((json.loads(line) for line in records), summary["main_metric"], out / "training_curve.png")
    atomic_write_text(out / "eval.json", json.dumps(summary, indent=2) + "\n")  # last: the run is complete
    log.info("fine-tuned model written to %s (dev %s %.4f)", out / "model", summary["main_metric"],
             best.metrics[summary["main_metric"]])


def evaluate(
    task: str, model: str | Path, data: str | Path, *, quantize: str | None = None, **options: Any
) -> dict[str, Any]:
    """Score a fine-tuned model on a labelled file (or rows in memory, as `finetune` takes them);
    returns the task's metrics (and the mean "loss").

    `options` are `DataOptions` fields (max_length, text_column, doc_stride, eval_batch_size, device, ...); use the
    ones the model was fine-tuned with. `quantize="int8"`: score the model with int8 dense layers, on the CPU
    (`bertforge.model.quantize`).
    """
    the_task, opts, tokenizer, net, encoded = _prepare(task, model, data, options, labelled=True, quantize=quantize)
    return _score(the_task, net, encoded, opts, tokenizer.pad_token_id, _device(opts))


def predict(
    task: str, model: str | Path, input: str | Path, output: str | Path | None = None, *,
    quantize: str | None = None, **options: Any
) -> list[dict[str, Any]]:
    """Predictions of a fine-tuned model for each example of `input` (labels there are not needed, and ignored;
    a file or rows in memory, as `finetune` takes them).

    Classification gives {"label", "score", "probabilities"} ({"labels": [{"label", "score"}, ...],
    "probabilities"} for a multi-label model: every label of probability at least 0.5; {"score"} for regression), NER {"tokens", "tags",
    "entities"}, QA {"id", "answer", "start", "end", "score", "null_score"}. With `output`, they are also written
    there as JSONL, atomically (never over `input` or a file of `model`). `quantize="int8"`: int8 dense layers, on
    the CPU (`bertforge.model.quantize`).
    """
    if output is not None:
        check_output_file(output, inputs=(input,) if is_path(input) else (), model=model)
    the_task, opts, tokenizer, net, encoded = _prepare(task, model, input, options, labelled=False, quantize=quantize)
    outputs, _ = run_model(
        net, encoded.features, opts.eval_batch_size, tokenizer.pad_token_id, _device(opts), opts.progress,
        "predicting", precision=opts.precision,
    )
    records = the_task.records(encoded, outputs, net.config, opts)
    if output is not None:
        atomic_write_text(output, "".join(json_line(r) for r in records))
    return records


def _prepare(
    task: str, model: str | Path, data: Any, options: dict[str, Any], labelled: bool, quantize: str | None
) -> tuple[Any, ...]:
    """What `evaluate` and `predict` start from: the task, its options, the tokenizer, the fine-tuned model (int8
    with `quantize`) and the encoded examples of `data`."""
    opts = make_settings(DataOptions, options)
    opts.validate()
    if quantize is not None:  # int8 runs on the CPU: refuse another device before anything is loaded
        check_quantize(quantize, opts.device or "cpu", "evaluate/predict")
        if opts.precision not in ("auto", "fp32"):
            raise BertforgeError(f"--precision {opts.precision} is for float models; --quantize {quantize} runs int8 "
                                 "layers")
        opts = dataclasses.replace(opts, device="cpu")  # a new value: settings are not changed once validated
    the_task = get_task(task)
    if not is_path(data):
        data = in_memory(data)
    examples, _ = the_task.read(data, opts, labelled=labelled)
    tokenizer = _load_tokenizer(model)
    net = quantize_model(load_finetuned(the_task, model).eval(), quantize,
                         calibration=calibration_ids(tokenizer) if quantize else None)
    encoded = the_task.encode(tokenizer, examples, opts, net.config, Path(str(data)), labelled=labelled)
    return the_task, opts, tokenizer, net, encoded


def _device(opts: DataOptions) -> torch.device:
    """Where `evaluate` and `predict` run (the runtime set up for inference)."""
    return setup_runtime(opts.device, training=False, distributed=False).device


def load_finetuned(task: Task, model: str | Path) -> Any:
    """The task's model class from `model`, which must hold a trained head for it."""
    architectures = BertConfig.from_pretrained(model).architectures or []
    wanted = task.model_class.__name__
    if architectures and wanted not in architectures:
        raise BertforgeError(f"{model}: a {', '.join(architectures)} checkpoint, not a {wanted} for --task {task.name}")
    net = task.model_class.from_pretrained(model, quiet=True)  # a missing head is refused below
    untrained = [k for k in net.loading_info.missing_keys if k.startswith(HEAD_PREFIXES)]
    if untrained:
        raise BertforgeError(
            f"{model}: no trained {task.name} head in this checkpoint (missing {', '.join(untrained)}); "
            f"fine-tune it first with `bertforge finetune --task {task.name}`"
        )
    return net


def _score(task: Task, model: Any, data: Encoded, opts: DataOptions, pad_token_id: int, device: torch.device) -> dict[str, Any]:
    outputs, loss = run_model(model, data.features, opts.eval_batch_size, pad_token_id, device, opts.progress,
                              precision=opts.precision)
    metrics = task.score(data, outputs, model.config, opts)
    if loss is not None:
        metrics["loss"] = loss
    return metrics


def _load_tokenizer(model: str | Path) -> Any:
    from ..tokenizer import Tokenizer

    return Tokenizer.from_pretrained(model)


def make_settings(cls: type, settings: dict[str, Any]) -> Any:
    """`cls(**settings)`, with an unknown or missing setting reported as a BertforgeError."""
    try:
        return cls(**settings)
    except TypeError as err:
        raise BertforgeError(f"bad settings: {err}") from None
