"""`bertforge serve`: the model behind an HTTP server (text-embeddings-inference's and OpenAI's embeddings APIs)."""

from __future__ import annotations

import argparse

from ..core.constants import POOLINGS
from . import add_device_argument, add_quantize_argument

NAME = "serve"
GUARDS = ("max_input_chars", "head_timeout", "body_timeout", "max_connections")  # declared in ServeConfig
HELP = ("serve a model over HTTP: /embed, /v1/embeddings (OpenAI), /predict, /rerank, /health, /metrics; "
        "dynamic batching, a bounded queue")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory (weights, config.json, tokenizer)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1; 0.0.0.0 for every interface)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (8080)")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="server processes, each with its own copy of the model and its share of the CPUs (1)")
    parser.add_argument("--task", choices=["auto", "embed", "classify"], default="auto",
                        help="embed (/embed, /v1/embeddings) or classify (/predict, /rerank); auto: classify for a "
                             "sequence-classification checkpoint, else embed")
    parser.add_argument("--model-name", default=None, metavar="NAME",
                        help="the name /info and /v1/embeddings report (default: the directory's name)")
    parser.add_argument("--max-batch-tokens", type=int, default=4096, metavar="N",
                        help="tokens per forward pass: waiting requests are grouped up to this (4096)")
    parser.add_argument("--max-queue", type=int, default=512, metavar="N",
                        help="requests that may wait for the model; more are refused at once with 503 (512)")
    parser.add_argument("--max-client-batch-size", type=int, default=256, metavar="N",
                        help="inputs in one request; more get 413 (256)")
    parser.add_argument("--max-body-bytes", type=int, default=2_000_000, metavar="N",
                        help="largest request body; larger ones get 413 (2000000)")
    parser.add_argument("--auto-truncate", action="store_true",
                        help='cut inputs longer than the model takes (the default of a request\'s "truncate"); '
                             "without it they get 413")
    parser.add_argument("--max-length", type=int, default=None, metavar="N",
                        help="longest input in tokens (default: the model's limit)")
    parser.add_argument("--pooling", choices=POOLINGS, default=None,
                        help="embedding models: default what a sentence-transformers model declares, else mean")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="PyTorch threads per process (default: the CPUs available, divided among the workers)")
    parser.add_argument("--graceful-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="on SIGTERM, how long in-flight requests may take before they are cut off (30)")
    add_quantize_argument(parser)
    add_device_argument(parser)
    from ..core.options import add_options
    from ..serve.config import ServeConfig

    add_options(parser.add_argument_group("what one client may cost"), ServeConfig, only=GUARDS)
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn's log level (info)")


def run(args: argparse.Namespace) -> int:
    from ..core.options import given
    from ..serve import ServeConfig, run_server

    config = ServeConfig(
        model=args.model, task=args.task, model_name=args.model_name, max_batch_tokens=args.max_batch_tokens,
        max_queue=args.max_queue, max_client_batch_size=args.max_client_batch_size,
        max_body_bytes=args.max_body_bytes, auto_truncate=args.auto_truncate, max_length=args.max_length,
        pooling=args.pooling, num_threads=args.threads, quantize=args.quantize, device=args.device,
        **given(args, ServeConfig, only=GUARDS),
    )
    return run_server(config, host=args.host, port=args.port, workers=args.workers, log_level=args.log_level,
                      graceful_timeout=args.graceful_timeout)
