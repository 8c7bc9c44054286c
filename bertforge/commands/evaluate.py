"""`bertforge evaluate`: score a model on a labelled file and print the metrics as JSON.

Fine-tuned models (classification, ner, qa) through `finetune.evaluate`; embedding models and rerankers (sts,
retrieval, rerank) through the pipelines and `bertforge.evaluation`, with sentence-transformers' evaluators'
numbers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..core.options import add_options
from ..finetune.cli_options import DATA_OPTIONS, add_data_arguments, given
from ..finetune.config import FINETUNE_TASKS, FinetuneConfig
from . import add_quantize_argument

NAME = "evaluate"
HELP = "score a model on labelled data (fine-tuned tasks, STS pairs, a BEIR folder, reranking rows); prints JSON"
EXAMPLES = (
    'bertforge evaluate --task classification --model runs/sst2/model --input test.csv',
    'bertforge evaluate --task sts --model all-MiniLM-L6-v2 --input stsb-test.csv',
    'bertforge evaluate --task retrieval --model all-MiniLM-L6-v2 --input scifact/ --out scifact.json',
    'bertforge evaluate --task retrieval --model all-MiniLM-L6-v2 --input scifact/ --reranker ms-marco-MiniLM-L6-v2 '
    '--rerank-top 20',
    'bertforge evaluate --task rerank --model ms-marco-MiniLM-L6-v2 --input rerank.jsonl',
)  # `--help` shows them; tests/test_cli.py parses them
EVALUATION_TASKS = ("sts", "retrieval", "rerank")
#: The data options the embedding and reranking tasks read; the others are fine-tuning's.
PIPELINE_OPTIONS = ("max_length", "eval_batch_size", "device", "progress", "precision")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", required=True, choices=tuple(dict.fromkeys((*FINETUNE_TASKS, *EVALUATION_TASKS))),
                        help="the task: classification, ner or qa (a fine-tuned model); sts (scored pairs), retrieval "
                             "(a BEIR folder) or rerank (query, positives, negatives rows)")
    add_options(parser, FinetuneConfig, only=("model",), required=("model",))
    parser.add_argument("--input", required=True, metavar="PATH",
                        help="labelled data in the task's format (retrieval: a BEIR folder)")
    group = parser.add_argument_group("retrieval and reranking")
    group.add_argument("--qrels", metavar="FILE", help="retrieval: the relevance judgements (default: "
                       "INPUT/qrels/test.tsv)")
    group.add_argument("--sparse", action="store_true", default=None,
                       help="retrieval and sts: score by SPLADE vectors of the model's MLM head (retrieval: their dot "
                            "product; sts: cosine and dot); default for a sentence-transformers SparseEncoder directory")
    group.add_argument("--reranker", metavar="DIR", help="retrieval: rerank each query's first results with this "
                       "cross-encoder")
    group.add_argument("--rerank-top", type=int, default=100, metavar="K",
                       help="retrieval with --reranker: how many first results are reranked (default: 100)")
    parser.add_argument("--out", metavar="FILE", help="also write the metrics to FILE (JSON)")
    add_data_arguments(parser)
    add_quantize_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..core.errors import BertforgeError
    from ..core.io import atomic_write_text, check_output_file
    from ..core.system import reuse_freed_memory

    if args.out is not None:
        folder = Path(args.input)  # a BEIR folder's files are inputs too
        inside = tuple(folder.rglob("*")) if folder.is_dir() else ()
        check_output_file(args.out, inputs=(args.input, args.qrels, *inside), model=args.model)
    reuse_freed_memory()  # this process's allocator keeps freed memory: no page faults per large tensor
    options = given(args, DATA_OPTIONS)
    if args.task in FINETUNE_TASKS and args.task not in EVALUATION_TASKS:
        extra = [flag for flag, value in (("--qrels", args.qrels), ("--sparse", args.sparse),
                                          ("--reranker", args.reranker)) if value is not None]
        if extra:
            raise BertforgeError(f"{', '.join(extra)}: options of --task retrieval, not {args.task}")
        from ..finetune import evaluate

        metrics = evaluate(args.task, args.model, args.input, quantize=args.quantize, **options)
    else:
        other = [f"--{name.replace('_', '-')}" for name in options if name not in PIPELINE_OPTIONS]
        if other:
            raise BertforgeError(f"{', '.join(other)}: fine-tuning's data options; --task {args.task} reads "
                                 f"{', '.join('--' + n.replace('_', '-') for n in PIPELINE_OPTIONS)}")
        metrics = evaluate_with_pipelines(args, options)
    text = json.dumps(metrics, indent=2)
    print(text)
    if args.out is not None:
        atomic_write_text(args.out, text + "\n")
    return 0


def evaluate_with_pipelines(args: argparse.Namespace, options: dict[str, Any]) -> dict[str, Any]:
    """sts, retrieval or rerank: the model (and reranker) as pipelines, scored by `bertforge.evaluation`."""
    import torch

    from ..core.errors import BertforgeError
    from ..evaluation import data, evaluators
    from ..pipelines.embed import EmbedPipeline
    from ..pipelines.rerank import RerankPipeline
    from ..pipelines.sparse import SparseEmbedPipeline

    settings = {"max_length": options.get("max_length"), "progress": options.get("progress"),
                "device": options.get("device"), "quantize": args.quantize,
                "precision": "fp32" if options.get("precision", "auto") == "auto" else options["precision"]}
    if "eval_batch_size" in options:
        settings["batch_size"] = options["eval_batch_size"]
    if args.task == "rerank":
        rows = data.read_rerank(args.input)
        return evaluators.evaluate_rerank(RerankPipeline(args.model, **settings).score, rows)
    if args.task == "sts":
        pairs = data.read_scored_pairs(args.input)
        sparse = bool(args.sparse) or is_sparse_encoder(args.model)  # a SparseEncoder: its vectors, cosine and dot
        embed = (SparseEmbedPipeline if sparse else EmbedPipeline)(args.model, **settings)
        return evaluators.evaluate_sts(lambda texts: torch.from_numpy(embed(texts)), pairs, embed.similarity)
    if args.rerank_top < 1:
        raise BertforgeError(f"--rerank-top must be a positive integer, got {args.rerank_top}")
    if args.rerank_top != 100 and args.reranker is None:
        raise BertforgeError("--rerank-top applies with --reranker")
    benchmark = data.read_beir(args.input, args.qrels)
    sparse = bool(args.sparse) or is_sparse_encoder(args.model)
    vectors = (SparseEmbedPipeline if sparse else EmbedPipeline)(args.model, **settings)
    reranker = None if args.reranker is None else RerankPipeline(args.reranker, **settings).score
    return evaluators.evaluate_retrieval(*query_and_document_encoders(vectors), benchmark,
                                         similarity=getattr(vectors, "similarity", "dot"), sparse=sparse,
                                         rerank=reranker, rerank_top=args.rerank_top)


def query_and_document_encoders(vectors: Any) -> tuple[Any, Any]:
    """Queries → a tensor at once, documents → a stream of vectors, each side with its sentence-transformers prompt
    ("query" / "document" when the model declares them, as `encode_query` / `encode_document` choose; otherwise the
    model's default)."""
    import torch

    def with_prompt(name: str) -> None:
        prompts = getattr(vectors, "prompts", None)
        if prompts is not None:
            vectors.prompt = vectors.choose_prompt(name if name in prompts else None, None, vectors.default_prompt_name)

    def queries(texts: list[str]) -> torch.Tensor:
        with_prompt("query")
        return torch.from_numpy(vectors(texts))

    def documents(texts: list[str]) -> Any:
        with_prompt("document")
        return vectors.stream(texts)

    return queries, documents


def is_sparse_encoder(model: str | Path) -> bool:
    """Whether a model directory is a sentence-transformers SparseEncoder (a SpladePooling module)."""
    from ..core.hub import model_path

    try:
        return "SpladePooling" in (model_path(model) / "modules.json").read_text(encoding="utf-8")
    except OSError:
        return False
