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
    "host": ("HOSTNAME", str, SERVE_DEFAULTS.host),  # read only where it is an IP address (`_host`)
    "port": ("PORT", int, SERVE_DEFAULTS.port),
    "api_key": ("API_KEY", str, None),
    "max_queue": ("MAX_CONCURRENT_REQUESTS", int, SERVE_DEFAULTS.max_queue),
    "max_batch_tokens": ("MAX_BATCH_TOKENS", int, SERVE_DEFAULTS.max_batch_tokens),
    "max_client_batch_size": ("MAX_CLIENT_BATCH_SIZE", int, SERVE_DEFAULTS.max_client_batch_size),
    "max_body_bytes": ("PAYLOAD_LIMIT", int, SERVE_DEFAULTS.max_body_bytes),
    "auto_truncate": ("AUTO_TRUNCATE", _flag, SERVE_DEFAULTS.auto_truncate),
    "pooling": ("POOLING", str, None),
    "revision": ("REVISION", str, None),
    "dtype": ("DTYPE", str, None),
    "tokenization_workers": ("TOKENIZATION_WORKERS", int, None),
    "max_batch_requests": ("MAX_BATCH_REQUESTS", int, None),
    "default_prompt_name": ("DEFAULT_PROMPT_NAME", str, None),
    "default_prompt": ("DEFAULT_PROMPT", str, None),
    "dense_path": ("DENSE_PATH", str, None),
    "hf_token": ("HF_TOKEN", str, None),
    "uds_path": ("UDS_PATH", str, None),
    "huggingface_hub_cache": ("HUGGINGFACE_HUB_CACHE", str, None),
    "json_output": ("JSON_OUTPUT", _flag, False),
    "disable_spans": ("DISABLE_SPANS", _flag, False),
    "otlp_endpoint": ("OTLP_ENDPOINT", str, None),
    "otlp_service_name": ("OTLP_SERVICE_NAME", str, "text-embeddings-inference.server"),
    "prometheus_port": ("PROMETHEUS_PORT", int, None),
    "cors_allow_origin": ("CORS_ALLOW_ORIGIN", lambda text: [o.strip() for o in text.split(",") if o.strip()], None),
}
#: TEI's options that are the process's, not the app's (ServeConfig's): `run` hands them to `run_server`
PROCESS = ("host", "port", "hf_token", "uds_path", "huggingface_hub_cache", "json_output", "prometheus_port")


def _env(dest: str) -> str:
    return f"${TEI_ENVIRONMENT[dest][0]}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-id", "--model", dest="model", default=None, metavar="DIR",
                        help=f"model directory (weights, config.json, tokenizer) or Hub id; {_env('model')} when "
                             "not given")
    parser.add_argument("--hostname", dest="host", default=None, metavar="HOST",
                        help=f"address to listen on (0.0.0.0 for every interface); {_env('host')} when not given "
                             "and it is an IP address (Docker sets it to the container's name, which is ignored: "
                             f"never every interface unless asked); default {SERVE_DEFAULTS.host}")
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
                        help=f"inputs in one request; more get 422; {_env('max_client_batch_size')} when not given "
                             f"(default {SERVE_DEFAULTS.max_client_batch_size}, TEI's)")
    parser.add_argument("--payload-limit", dest="max_body_bytes", type=int, default=None,
                        metavar="N", help=f"largest request body in bytes; larger ones get 413; "
                                          f"{_env('max_body_bytes')} when not given "
                                          f"(default {SERVE_DEFAULTS.max_body_bytes})")
    parser.add_argument("--auto-truncate", type=_flag, nargs="?", const=True, default=None, metavar="BOOL",
                        help='cut inputs longer than the model takes (the default of a request\'s "truncate"); '
                             f"false: they get 422; {_env('auto_truncate')} when not given (default true, TEI's)")
    parser.add_argument("--max-length", type=int, default=None, metavar="N",
                        help="longest input in tokens (default: the model's limit)")
    parser.add_argument("--pooling", choices=(*POOLINGS, "splade"), default=None,
                        help="embedding models: default what a sentence-transformers model declares, else mean; "
                             "splade: a masked-LM checkpoint's sparse vectors on /embed_sparse (TEI's rule); "
                             f"{_env('pooling')} when not given")
    tei = parser.add_argument_group("text-embeddings-inference's other launcher options (each also read from its "
                                    "environment variable, as TEI reads it)")
    tei.add_argument("--revision", default=None, help="the Hub revision of a model given by id")
    tei.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default=None,
                     help="float32 (a CPU's default) or bfloat16 (bf16 autocast) on a CPU; float16 on a GPU (its "
                          "default); anything else is refused at start-up")
    tei.add_argument("--tokenization-workers", type=int, default=None, metavar="N",
                     help="threads that tokenize large requests and write large answers (default: the CPUs)")
    tei.add_argument("--max-batch-requests", type=int, default=None, metavar="N",
                     help="inputs in one forward pass at most (default: as many as --max-batch-tokens holds)")
    tei.add_argument("--default-prompt-name", default=None, metavar="NAME",
                     help="the sentence-transformers prompt put before each input of a request naming none")
    tei.add_argument("--default-prompt", default=None, metavar="TEXT",
                     help="a prompt text put before each input of a request naming none")
    tei.add_argument("--dense-path", default=None, metavar="DIR",
                     help="a sentence-transformers Dense module applied after pooling: its directory, or one of the "
                          "model directory's (e.g. 2_Dense); config.json and model.safetensors")
    tei.add_argument("--hf-token", default=None, metavar="TOKEN", help="the Hub token for a model given by id")
    tei.add_argument("--huggingface-hub-cache", default=None, metavar="DIR",
                     help="the Hub cache a model given by id is read from and downloaded to")
    tei.add_argument("--uds-path", default=None, metavar="PATH",
                     help="listen on this Unix domain socket instead of --hostname/--port")
    tei.add_argument("--json-output", type=_flag, nargs="?", const=True, default=None, metavar="BOOL",
                     help="log lines as JSON objects")
    tei.add_argument("--disable-spans", type=_flag, nargs="?", const=True, default=None, metavar="BOOL",
                     help="no per-request spans in the log or the traces (bertforge logs none; with "
                          "--otlp-endpoint it sends none)")
    tei.add_argument("--otlp-endpoint", default=None, metavar="URL",
                     help="send OpenTelemetry traces (a span per request) to this OTLP/gRPC endpoint; needs the "
                          "`otel` extra, refused at start-up without it")
    tei.add_argument("--otlp-service-name", default=None, metavar="NAME",
                     help="the traces' service name (text-embeddings-inference.server)")
    tei.add_argument("--prometheus-port", type=int, default=None, metavar="PORT",
                     help="also serve /metrics on this port, on its own (TEI serves it on 9000; default: only "
                          "the API's /metrics)")
    tei.add_argument("--cors-allow-origin", action="append", default=None, metavar="ORIGIN",
                     help="CORS: an origin allowed to call the API (repeatable; * for any); default: no CORS "
                          "headers")
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
    values["host"] = _host(args.host, environ)
    if values["dtype"] is not None and values["dtype"] not in ("float32", "float16", "bfloat16"):
        raise BertforgeError(f"serve: $DTYPE must be float32, float16 or bfloat16, got {values['dtype']!r:.60}")
    if values["pooling"] is not None and values["pooling"] not in (*POOLINGS, "splade"):
        raise BertforgeError(f"serve: $POOLING must be one of {', '.join(POOLINGS)}, got {values['pooling']!r:.60}")
    return values


def _host(given: str | None, environ: Any) -> str:
    """The address to listen on: --hostname; else $HOSTNAME (TEI's variable) only where it is an IP address: Docker
    sets $HOSTNAME to the container's name, and that must not make a server listen on the container's network
    address with nobody asking; else 127.0.0.1."""
    import ipaddress

    if given is not None:
        return given
    text = environ.get("HOSTNAME", "").strip()
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return SERVE_DEFAULTS.host
    return text


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
    process = {name: tei.pop(name) for name in PROCESS}
    tei["disable_spans"] = bool(tei["disable_spans"])
    process["json_output"] = bool(process["json_output"])
    if process["hf_token"]:  # read by huggingface_hub when a model given by id is resolved
        os.environ["HF_TOKEN"] = process["hf_token"]
    if process["huggingface_hub_cache"]:
        os.environ["HF_HUB_CACHE"] = process["huggingface_hub_cache"]
    config = ServeConfig(task=args.task, max_length=args.max_length, num_threads=args.threads,
                         quantize=args.quantize, device=args.device, adapters=adapter_options(args.adapters or []),
                         **tei, **given(args, ServeConfig, only=GUARDS))
    return run_server(config, host=process["host"], port=process["port"], workers=args.workers,
                      log_level=args.log_level, graceful_timeout=args.graceful_timeout, uds=process["uds_path"],
                      json_output=process["json_output"], prometheus_port=process["prometheus_port"])
