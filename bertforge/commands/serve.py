"""`bertforge serve`: the model behind an HTTP server (text-embeddings-inference's and OpenAI's embeddings APIs).

Its options carry text-embeddings-inference's names where TEI has the option (`--model-id`, `--served-model-name`,
`--max-concurrent-requests`, `--hostname`, `--payload-limit`, `--api-key`, ...), and read the environment variables
TEI reads for them (`TEI_ENVIRONMENT`) when not given: a flag on the command line wins, then the variable, then
the default."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from ..core.constants import POOLINGS, SERVE_DEFAULTS
from ..core.errors import BertforgeError
from . import add_device_argument, add_quantize_argument

NAME = "serve"
GUARDS = ("max_input_chars", "max_response_values", "head_timeout", "body_timeout", "max_connections")  # declared in ServeConfig
HELP = ("serve a model over HTTP with text-embeddings-inference's API (/embed, /embed_all, /embed_sparse, "
        "/similarity, /predict, /rerank, /tokenize, /decode) and OpenAI's /v1/embeddings; dynamic batching, a "
        "bounded queue")
EXAMPLES = (
    'bertforge serve --model-id runs/my-embedder --port 8080 --workers 2',
)  # `--help` shows them; tests/test_cli.py parses them


def _flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


#: option (its `dest`) -> (TEI's environment variable, how its text is read, the default when neither is given)
TEI_ENVIRONMENT: dict[str, tuple[str, Callable[[str], Any], Any]] = {
    "model": ("MODEL_ID", str, None),
    "model_name": ("SERVED_MODEL_NAME", str, None),
    "host": ("HOSTNAME", str, SERVE_DEFAULTS.host),
    "port": ("PORT", int, SERVE_DEFAULTS.port),
    "api_key": ("API_KEY", str, None),
    "max_queue": ("MAX_CONCURRENT_REQUESTS", int, SERVE_DEFAULTS.max_queue),
    "max_batch_tokens": ("MAX_BATCH_TOKENS", int, SERVE_DEFAULTS.max_batch_tokens),
    "max_client_batch_size": ("MAX_CLIENT_BATCH_SIZE", int, SERVE_DEFAULTS.max_client_batch_size),
    "max_body_bytes": ("PAYLOAD_LIMIT", int, SERVE_DEFAULTS.max_body_bytes),
    "auto_truncate": ("AUTO_TRUNCATE", _flag, False),
    "pooling": ("POOLING", str, None),
}


def _env(dest: str) -> str:
    return f"${TEI_ENVIRONMENT[dest][0]}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-id", "--model", dest="model", default=None, metavar="DIR",
                        help=f"model directory (weights, config.json, tokenizer) or Hub id; {_env('model')} when "
                             "not given")
    parser.add_argument("--hostname", dest="host", default=None, metavar="HOST",
                        help=f"address to listen on (0.0.0.0 for every interface); {_env('host')} when not given "
                             f"(default {SERVE_DEFAULTS.host})")
    parser.add_argument("--port", "-p", type=int, default=None,
                        help=f"port to listen on; {_env('port')} when not given (default {SERVE_DEFAULTS.port})")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="server processes, each with its own copy of the model and its share of the CPUs; "
                             "/metrics counts them all (1)")
    parser.add_argument("--task", choices=["auto", "embed", "classify"], default="auto",
                        help="embed (/embed, /embed_all, /embed_sparse, /similarity, /v1/embeddings) or classify "
                             "(/predict, /rerank); auto: classify for a sequence-classification checkpoint, else embed")
    parser.add_argument("--served-model-name", dest="model_name", default=None, metavar="NAME",
                        help=f"the name /info and /v1/embeddings report; {_env('model_name')} when not given "
                             "(default: the directory's name)")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help="every route but the health probes and /metrics answers 401 without `Authorization: Bearer KEY`; "
                             f"{_env('api_key')} when not given")
    parser.add_argument("--max-batch-tokens", type=int, default=None, metavar="N",
                        help="tokens per forward pass: waiting requests are grouped up to this; "
                             f"{_env('max_batch_tokens')} when not given (default {SERVE_DEFAULTS.max_batch_tokens})")
    parser.add_argument("--max-concurrent-requests", dest="max_queue", type=int, default=None,
                        metavar="N", help="requests that may wait for the model (per worker); more are refused at once "
                                          f"with 429; {_env('max_queue')} when not given "
                                          f"(default {SERVE_DEFAULTS.max_queue})")
    parser.add_argument("--max-client-batch-size", type=int, default=None, metavar="N",
                        help=f"inputs in one request; more get 413; {_env('max_client_batch_size')} when not given "
                             f"(default {SERVE_DEFAULTS.max_client_batch_size})")
    parser.add_argument("--payload-limit", dest="max_body_bytes", type=int, default=None,
                        metavar="N", help=f"largest request body in bytes; larger ones get 413; "
                                          f"{_env('max_body_bytes')} when not given "
                                          f"(default {SERVE_DEFAULTS.max_body_bytes})")
    parser.add_argument("--auto-truncate", action="store_true", default=None,
                        help='cut inputs longer than the model takes (the default of a request\'s "truncate"); '
                             f"without it they get 413; {_env('auto_truncate')}=true when not given")
    parser.add_argument("--max-length", type=int, default=None, metavar="N",
                        help="longest input in tokens (default: the model's limit)")
    parser.add_argument("--pooling", choices=POOLINGS, default=None,
                        help="embedding models: default what a sentence-transformers model declares, else mean; "
                             f"{_env('pooling')} when not given")
    parser.add_argument("--adapter", dest="adapters", action="append", default=None, metavar="NAME=DIR",
                        help="a PEFT LoRA directory served on the base model under NAME (repeatable: several on one "
                             'copy of the base\'s weights); a request picks one with "adapter": NAME in its body '
                             '(on /v1/embeddings "model": NAME), else the base model answers')
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


def from_environment(args: argparse.Namespace, environ: Any = None) -> dict[str, Any]:
    """The TEI-named options: each as given on the command line, else from its environment variable, else its
    default. A variable that does not read as its option's type is one line naming it."""
    environ = os.environ if environ is None else environ
    values = {}
    for dest, (variable, read, default) in TEI_ENVIRONMENT.items():
        value = getattr(args, dest)
        text = environ.get(variable, "")
        if value is None and text != "":
            try:
                value = read(text)
            except ValueError:
                raise BertforgeError(f"serve: ${variable} must be {'true or false' if read is _flag else read.__name__}"
                                     f", got {text!r:.60}") from None
        values[dest] = default if value is None else value
    if values["model"] is None:
        raise BertforgeError("serve: give the model: --model-id DIR (or set $MODEL_ID)")
    if values["pooling"] is not None and values["pooling"] not in POOLINGS:
        raise BertforgeError(f"serve: $POOLING must be one of {', '.join(POOLINGS)}, got {values['pooling']!r:.60}")
    return values


def adapter_options(values: list[str]) -> dict[str, str]:
    """`--adapter NAME=DIR` options as {NAME: DIR}; a value without a name, or a name given twice, is one line."""
    adapters: dict[str, str] = {}
    for value in values:
        name, sep, directory = value.partition("=")
        if not sep or not name.strip() or not directory:
            raise BertforgeError(f"serve: --adapter takes NAME=DIR, got {value!r:.80}")
        if name in adapters:
            raise BertforgeError(f"serve: --adapter {name!r} is given twice")
        adapters[name] = directory
    return adapters


def run(args: argparse.Namespace) -> int:
    from ..core.options import given
    from ..serve import ServeConfig, run_server

    tei = from_environment(args)
    host, port = tei.pop("host"), tei.pop("port")
    config = ServeConfig(task=args.task, max_length=args.max_length, num_threads=args.threads,
                         quantize=args.quantize, device=args.device, adapters=adapter_options(args.adapters or []),
                         **tei, **given(args, ServeConfig, only=GUARDS))
    return run_server(config, host=host, port=port, workers=args.workers, log_level=args.log_level,
                      graceful_timeout=args.graceful_timeout)
