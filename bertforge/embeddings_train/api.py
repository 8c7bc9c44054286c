"""`train_embeddings`, the Python API behind `bertforge train-embeddings`."""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from ..model.card import ModelCard
from ..model.config import BertConfig
from ..core.errors import BertforgeError
from ..finetune.api import make_settings
from ..core.io import atomic_write_text
from ..model.memory import check_training_fits
from ..model import BertModel
from ..model import BertForMaskedLM, BertPreTrainedModel
from ..model.checkpoint import check_mlm_head
from ..model.pooling import (SPLADE_POOLING_DIR, sentence_transformers_settings, write_sentence_transformers_files,
                             write_sparse_encoder_files)
from ..core.system import Runtime, barrier, from_main, on_main, setup_runtime, teardown_runtime
from ..training.adapters import save_trained
from ..training.checkpoint import TrainingCheckpoints
from ..training.loop import RunLifecycle, open_metrics
from ..training.run_dir import RunDirectory, RunKind
from ..training.step import refuse_nonfinite
from ..training.log import Panel, plot_curves, read_rows
from ..finetune.trainer import TrainResult, run_logged
from .config import EmbeddingsConfig
from .data import PROMPT_ROLES, PairData, column_prompts, normalized_scores, read_pairs, with_prompts
from .encoder import SPLADE, embed_all
from .evaluation import DevSet, dev_evaluator, main_metric, read_dev
from .losses import Loss, Splade, make_loss
from .trainer import EmbeddingTraining, encode_pairs
from ..core.hub import model_path, model_reference
from ..data.tables import InMemory, split_in_memory

log = logging.getLogger("bertforge")

RUN_MARKER = "train_embeddings_config.json"  # marks a directory as this command's output
DEFAULT_MAX_LENGTH = 128
# OUT is the sentence-transformers model itself: its files (the tokenizer's vocabulary files of any kind among
# them), the run's logs and checkpoints; what --overwrite replaces, and the settings a --resume may change
EMBEDDINGS = RunKind(
    command="train-embeddings", what="train-embeddings run", config_file=RUN_MARKER,
    entries=("checkpoints", "config.json", "model.safetensors", "README.md", "tokenizer.json", "tokenizer_config.json",
             "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt", "modules.json",
             "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling", "2_Normalize",
             SPLADE_POOLING_DIR,
             "tensorboard", "metrics.jsonl", "eval.json", "training_curve.png", RUN_MARKER),
    resumable=frozenset({"out", "resume", "overwrite", "progress", "save_every", "keep_checkpoints", "log_every",
                         "max_skipped_steps", "versions"}),
)


def train_embeddings(config: EmbeddingsConfig | None = None, **settings: Any) -> dict[str, Any]:
    """Train a sentence-embedding model on pairs, triplets or scored pairs (or scored triplets: margin-MSE); write a
    sentence-transformers model. With `sparse="splade"`, a SPLADE encoder from a model with an MLM head, written as
    a sentence-transformers SparseEncoder (`modules.json`: MLMTransformer, `1_SpladePooling/`); `prompts` (NAME=TEXT
    strings or a dict) go before the texts of the columns they name and are saved as the model's prompts.

    Pass an `EmbeddingsConfig`, or its fields as keywords: `train_embeddings(model=..., train="pairs.tsv",
    dev="dev.tsv", out=..., batch_size=256, mini_batch_size=32)`; `train` and `dev` may also be rows in memory (a
    list of dicts, a dict of lists, a `datasets.Dataset`), recorded in the settings file as `<in-memory: N rows,
    sha256 …>` (such a run cannot be replayed from it). Everything is read and checked before `out`
    changes. At the end `out` holds the model (config.json, model.safetensors, the tokenizer, `modules.json`,
    `sentence_bert_config.json`, `1_Pooling/`, `2_Normalize/`: `SentenceTransformer(out)` and
    `bertforge.pipeline("embed", model=out)` both load it), `eval.json` (dev metrics before training and at the best
    evaluation; written last: the run is complete when it is there), `metrics.jsonl`, `tensorboard/`,
    `training_curve.png`, `train_embeddings_config.json`, and `checkpoints/step-N/` (the newest `keep_checkpoints`,
    at each epoch's end, where early stopping ends the run and every `save_every` steps): `resume=True` continues a
    stopped run from the newest one, ending as if it had never stopped; `overwrite=True` keeps the run it replaces
    aside until the new run's first checkpoint. Under `torchrun --nproc-per-node N`, `batch_size` is the global
    batch: each process embeds its share and the loss sees the whole batch; rank 0 writes `out`.

    Returns the contents of `eval.json`.
    """
    cfg = config if config is not None else make_settings(EmbeddingsConfig, settings)
    cfg, rows = split_in_memory(cfg, ("train", "dev"))  # rows in memory: the settings record a description
    cfg.validate()
    rt = setup_runtime(cfg.device)  # torchrun's process group, before anything is read or written
    paths = {k: str(Path(getattr(cfg, k)).resolve()) for k in ("train", "dev", "out") if getattr(cfg, k)
             and k not in rows}
    paths["model"] = model_reference(cfg.model) if cfg.model else cfg.model
    cfg = dataclasses.replace(cfg, **paths)
    out = Path(cfg.out)
    saved = {**cfg.to_dict(), "resume": False, "overwrite": False,
             "versions": {"bertforge": __version__, "torch": torch.__version__}}
    lifecycle = RunLifecycle(RunDirectory(out, cfg.resume, cfg.overwrite, saved, EMBEDDINGS), rt)
    with lifecycle.guarded():  # a failure puts back a run --overwrite set aside; the lock goes either way
        lifecycle.lock(lifecycle.run_dir.refuse_foreign)
        summary = _train(cfg, out, rt, lifecycle, rows)
    # on success only (after an error, other ranks may still be inside a collective), once the DDP wrapper, which
    # holds the process group, is gone (see `Pretrainer.finish`: destroyed last inside the wrapper, it can hang)
    gc.collect()
    teardown_runtime(rt)
    return summary


def _train(cfg: EmbeddingsConfig, out: Path, rt: Runtime, lifecycle: RunLifecycle,
           rows: dict[str, InMemory]) -> dict[str, Any]:
    from ..tokenizer import Tokenizer

    device = rt.device
    tokenizer = Tokenizer.from_pretrained(cfg.model)
    model_config = BertConfig.from_pretrained(cfg.model)
    declared = sentence_transformers_settings(model_path(cfg.model))
    sparse = cfg.sparse or ("splade" if declared.get("sparse") else None)  # a SparseEncoder trains on as one
    if sparse and (cfg.pooling is not None or cfg.matryoshka_dims is not None):
        raise BertforgeError(f"--{'pooling' if cfg.pooling is not None else 'matryoshka-dims'} applies to dense "
                             f"embeddings, not --sparse {sparse} (SPLADE pools the MLM logits over the tokens)")
    pooling = SPLADE if sparse else cfg.pooling or declared.get("pooling", "mean")
    max_length = _max_length(cfg, declared, model_config, tokenizer)
    train_data = read_pairs(rows.get("train", cfg.train))
    dev_data = read_dev(rows.get("dev", cfg.dev)) if cfg.dev else None
    loss_name = _loss_name(cfg, train_data)
    dims = cfg.dims()
    if dims and dims[0] > model_config.hidden_size:
        raise BertforgeError(f"--matryoshka-dims {dims[0]} is larger than the embedding ({model_config.hidden_size})")
    prompts = cfg.prompt_map()
    train_prompts = column_prompts(train_data, prompts)  # each column's; a name that is no column is refused
    labels = (normalized_scores(train_data, cfg.score_max) if train_data.shape == "scored"
              else train_data.scores if train_data.shape == "scored-triplets" else None)  # margins: as they are
    encoded = encode_pairs(tokenizer, with_prompts(train_data, train_prompts), max_length, labels)
    texts = -(-cfg.batch_size // rt.world_size) * len(train_data.texts)  # a rank's share of a batch
    check_training_fits(model_config, min(cfg.mini_batch_size or texts, texts), max_length, device,
                        head="classification", what=f"training embeddings from {cfg.model}")
    torch.manual_seed(cfg.seed)  # dropout, and a pooler the checkpoint lacks (unused, saved for transformers)
    model: BertPreTrainedModel = (BertForMaskedLM if sparse else BertModel).from_pretrained(cfg.model, quiet=True)
    if sparse:
        check_mlm_head(model, f"--sparse {sparse}: {cfg.model}")
    model.to(device)
    if rt.rank:
        torch.manual_seed(cfg.seed + rt.rank)  # each rank its own dropout masks (rank 0: one process's)
    log.info("train-embeddings: %d %s from %s, loss %s%s, %s pooling, up to %d tokens a text", len(train_data),
             train_data.shape, cfg.train, loss_name, f" (matryoshka {dims})" if dims else "", pooling, max_length)
    # the prompts the model is saved with: sentence-transformers' "query" and "document" are the first and the
    # second column's (what evaluate, --dev, encode_query and encode_document apply), beside those given by column
    saved_prompts = {**declared.get("prompts", {}), **prompts}
    if prompts:
        saved_prompts.update({role: p for role, p in zip(PROMPT_ROLES, train_prompts) if p and role not in prompts})
    evaluate = None
    if dev_data is not None:  # rank 0 scores, every rank learns the metrics (the same decisions), as `finetune` does
        dev_prompts = {role: p for role, p in zip(PROMPT_ROLES, train_prompts) if p}
        score = _evaluator(dev_data, tokenizer, model, pooling, max_length, device, cfg, dev_prompts)
        evaluate = lambda: from_main(rt, score)  # noqa: E731
    loss: Loss = make_loss(loss_name, cfg.scale_value(loss_name), cfg.symmetric, dims,
                           similarity="dot" if sparse else "cosine")
    if sparse:
        loss = Splade(loss, cfg.query_regularizer, cfg.document_regularizer)
    metric = main_metric(dev_data) if dev_data is not None else None
    run = EmbeddingTraining(model, encoded, evaluate, cfg, metric, loss, pooling, device, rt)
    run.enable_checkpoints(TrainingCheckpoints(out, rt, run.stepper, cfg.keep_checkpoints, model.config), cfg.save_every)
    lifecycle.prepare()  # the first change to `out`
    resumed = cfg.resume and run.resume()
    metrics = open_metrics(out, cfg.resume, resumed, run.stepper.step, enabled=rt.is_main)
    result = run_logged(run, metrics, "training embeddings", lifecycle)
    run.encoder = run.train_model = getattr(run.encoder, "module", run.encoder)  # the DDP wrapper goes
    lifecycle.checkpointed()  # (done at the first checkpoint already)
    summary = {
        "train": cfg.train, "shape": train_data.shape, "loss": loss_name, "dev": cfg.dev, "main_metric": metric,
        "before": run.baseline,
        "best": None if result.best is None else {"step": result.best.step, "epoch": result.best.epoch,
                                                  "metrics": result.best.metrics},
        "train_steps": result.steps, "skipped_steps": result.skipped_steps,
        "train_seconds": round(result.seconds, 2), "stopped_early": result.stopped_early,
    }
    recipe = {"loss": loss_name, "pooling": pooling, "batch_size": cfg.batch_size, "lr": cfg.lr,
              "max_length": max_length, "seed": cfg.seed}
    if sparse:
        recipe.update(sparse=sparse, query_regularizer=cfg.query_regularizer,
                      document_regularizer=cfg.document_regularizer)
    if saved_prompts:
        recipe["prompts"] = saved_prompts
    default_prompt = declared.get("default_prompt_name")
    recipe["default_prompt_name"] = default_prompt if default_prompt in saved_prompts else None
    on_main(rt, lambda: _write_model(cfg, out, model, tokenizer, result, summary, recipe))
    barrier(rt)
    return summary


def _write_model(cfg: EmbeddingsConfig, out: Path, model: BertPreTrainedModel, tokenizer: Any, result: TrainResult,
                 summary: dict[str, Any], recipe: dict[str, Any]) -> None:
    """The sentence-transformers model (a SparseEncoder for --sparse), in `out` beside the run's logs (rank 0);
    eval.json last."""
    refuse_nonfinite(model.state_dict(), str(out))
    best = None if result.best is None else result.best.metrics
    sparse = recipe["pooling"] == SPLADE
    save_trained(model, out, cfg, cfg.model, ModelCard(
        base_model=cfg.model, datasets=(cfg.train,), trained_by="train-embeddings", library="sentence-transformers",
        pipeline_tag="feature-extraction" if sparse else "sentence-similarity", metrics=best or {},
        metrics_on=f"`{cfg.dev}` (the best evaluation)", recipe=recipe))
    tokenizer.save_pretrained(out)
    versions = {"bertforge": __version__, "pytorch": torch.__version__}
    prompts, default = recipe.get("prompts"), recipe["default_prompt_name"]
    if sparse:
        write_sparse_encoder_files(out, model.config.vocab_size, recipe["max_length"], versions, prompts, default)
    else:
        write_sentence_transformers_files(out, model.config.hidden_size, recipe["pooling"], cfg.normalize,
                                          recipe["max_length"], versions, prompts, default)
    _plot(out, summary["main_metric"])
    atomic_write_text(out / "eval.json", json.dumps(summary, indent=2) + "\n")  # last: the run is complete
    log.info("sentence-transformers model written to %s", out)


def _max_length(cfg: EmbeddingsConfig, declared: dict[str, Any], config: BertConfig, tokenizer: Any) -> int:
    """Tokens a text may have: --max-length, else the model's max_seq_length, else 128; at most the model's limit."""
    limit = min(config.max_sequence_length, tokenizer.model_max_length)
    if cfg.max_length is not None:
        config.check_sequence_length(cfg.max_length, "--max-length")
        if cfg.max_length > limit:
            raise BertforgeError(f"--max-length {cfg.max_length} is beyond the tokenizer's model_max_length {limit}")
        return cfg.max_length
    return min(declared.get("max_length", DEFAULT_MAX_LENGTH), limit)


#: The shapes of file each loss reads, and how its error names them
LOSS_SHAPES = {"mnrl": (("pairs", "triplets"), "pairs or triplets"),
               "cosent": (("scored",), "scored pairs (two texts and a score)"),
               "cosine": (("scored",), "scored pairs (two texts and a score)"),
               "margin-mse": (("scored-triplets",), "scored triplets (query, positive, negative and the teacher's "
                                                    "margin score(query, positive) - score(query, negative))")}
AUTO_LOSS = {"pairs": "mnrl", "triplets": "mnrl", "scored": "cosent", "scored-triplets": "margin-mse"}


def _loss_name(cfg: EmbeddingsConfig, data: PairData) -> str:
    """--loss, with auto resolved by the file's shape; a loss that cannot use the file is refused."""
    name = cfg.loss if cfg.loss != "auto" else AUTO_LOSS[data.shape]
    shapes, wanted = LOSS_SHAPES[name]
    if data.shape not in shapes:
        held = data.shape.replace("-", " ")
        raise BertforgeError(f"{data.path}: --loss {name} needs {wanted}; this file holds {held}")
    if cfg.symmetric and name != "mnrl":
        raise BertforgeError(f"--symmetric applies to --loss mnrl, not {name}")
    return name


def _evaluator(data: DevSet, tokenizer: Any, model: BertPreTrainedModel, pooling: str, max_length: int,
               device: torch.device, cfg: EmbeddingsConfig, prompts: dict[str, str]):
    """The dev scoring function (`evaluation.dev_evaluator`) on the model being trained."""
    from ..training.step import autocast, pick_precision

    precision = pick_precision("auto", device, training=False)  # dev scoring: inference's precision

    def embed(texts: list[str]) -> torch.Tensor:
        ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
        return embed_all(model, ids, pooling, device, cfg.eval_batch_size, lambda: autocast(device, precision))

    return dev_evaluator(data, embed, sparse=pooling == SPLADE, prompts=prompts)


def _plot(work: Path, metric: str | None) -> None:
    panels = [Panel("training loss", ("loss",), kind="train"), Panel("learning rate", ("lr",), kind="train")]
    if metric is not None:
        panels.insert(1, Panel(f"dev {metric}", (metric,), kind="eval", marker="o"))
    plot_curves(read_rows(work / "metrics.jsonl"), work / "training_curve.png", panels, title="sentence embeddings")


