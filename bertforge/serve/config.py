"""The server's options: `ServeConfig` (the command line's options, JSON in $BERTFORGE_SERVE_CONFIG for the
worker processes of `--workers N`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ..core.constants import SERVE_DEFAULTS
from ..core.errors import BertforgeError
from ..core.options import option

ENV_CONFIG = "BERTFORGE_SERVE_CONFIG"
TASKS = ("auto", "embed", "classify")
DTYPES = ("float32", "float16", "bfloat16")
OPTIONAL = ("max_input_chars", "max_batch_requests", "tokenization_workers")  # None: no bound of their own


@dataclass(frozen=True)
class ServeConfig:
    """What the server serves and its limits (the command line's options)."""

    model: str
    task: str = "auto"  # "embed", "classify" (predict + rerank), or "auto": from the checkpoint's architecture
    model_name: str | None = None  # reported by /info and /v1/embeddings; default: the directory's name
    # what it takes at once: `constants.SERVE_DEFAULTS` says each default and what it bounds
    max_batch_tokens: int = SERVE_DEFAULTS.max_batch_tokens
    max_queue: int = SERVE_DEFAULTS.max_queue
    max_client_batch_size: int = SERVE_DEFAULTS.max_client_batch_size
    max_body_bytes: int = SERVE_DEFAULTS.max_body_bytes
    auto_truncate: bool = SERVE_DEFAULTS.auto_truncate  # a request's "truncate" default (/v1/embeddings: the only one)
    max_length: int | None = None  # the model's limit by default (sentence-transformers' max_seq_length for embed)
    pooling: str | None = None  # embed: one of `POOLINGS` or "splade"; default: what the model directory declares
    num_threads: int | None = None  # PyTorch threads
    quantize: str | None = None  # "int8": int8 dense layers (CPU); None: float32
    device: str | None = None  # where the model runs (`core.system.inference_device`): cpu by default
    api_key: str | None = None  # every route but the health probes and /metrics needs `Authorization: Bearer KEY`
    # PEFT LoRA directories on the one base model, by name: a request picks one with "adapter" (or "model" on
    # /v1/embeddings); without, the base model answers
    adapters: dict[str, str] = field(default_factory=dict)
    # TEI's launcher options (`bertforge serve` takes them by their TEI names; see docs/guides/serving.md)
    revision: str | None = None  # the Hub revision of a model given by id
    dtype: str | None = None  # "float32" (or "bfloat16" on a CPU: bf16 autocast); "float16" needs a GPU
    default_prompt_name: str | None = None  # the sentence-transformers prompt of requests that name none
    default_prompt: str | None = None  # ... or a prompt text
    max_batch_requests: int | None = None  # requests in one forward pass (None: as many as fit max_batch_tokens)
    tokenization_workers: int | None = None  # threads that tokenize large requests (None: the CPUs)
    dense_path: str | None = None  # the sentence-transformers Dense module (its directory) after pooling
    cors_allow_origin: list[str] | None = None  # CORS' allowed origins ("*": any); None: no CORS headers
    otlp_endpoint: str | None = None  # OpenTelemetry traces to this OTLP/gRPC endpoint
    otlp_service_name: str = "text-embeddings-inference.server"
    disable_spans: bool = False  # no per-request spans in the log
    # What one client may cost the server (the command line's options are generated from these declarations).
    max_input_chars: int | None = option(
        None, "characters of one input (each text of a pair) the server reads: longer ones get 413, or are cut to "
              "this with truncate, before any tokenizing (default: 16 per token of the model's max length)",
        metavar="N")
    max_response_values: int = option(
        4_194_304, "numbers one answer may hold (/embed_all: tokens x hidden size; /embed_sparse: inputs x "
                   "vocabulary); a request that could answer more gets 422 naming it", metavar="N")
    head_timeout: float = option(10.0, "seconds a connection may take to send a request's head (and stay idle "
                                       "before its first one); then 408 and closed", metavar="SECONDS")
    body_timeout: float = option(30.0, "seconds a request's body may take to arrive, from the end of its head; "
                                       "then 408 and closed", metavar="SECONDS")
    max_connections: int = option(1000, "open connections; one more is answered 503 and closed", metavar="N")

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise BertforgeError(f"serve: task must be one of {', '.join(TASKS)}, got {self.task!r}")
        for name in ("max_batch_tokens", "max_queue", "max_client_batch_size", "max_body_bytes", "max_connections",
                     "max_input_chars", "max_batch_requests", "tokenization_workers", "max_response_values"):
            value = getattr(self, name)
            if (value is not None or name not in OPTIONAL) and (
                    not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise BertforgeError(f"serve: {name} must be a positive integer, got {value!r}")
        if not isinstance(self.adapters, dict) or not all(
                isinstance(k, str) and k.strip() and isinstance(v, str) and v for k, v in self.adapters.items()):
            raise BertforgeError(f"serve: adapters must map names to adapter directories, got {self.adapters!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise BertforgeError(f"serve: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.default_prompt is not None and self.default_prompt_name is not None:
            raise BertforgeError("serve: give --default-prompt-name or --default-prompt, not both (as TEI)")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise BertforgeError("serve: api_key must be a non-empty string (or None: no key needed)")
        for name in ("head_timeout", "body_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise BertforgeError(f"serve: {name} must be a positive number of seconds, got {value!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServeConfig:
        return cls(**json.loads(text))
