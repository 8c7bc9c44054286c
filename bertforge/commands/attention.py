"""`bertforge attention`: heatmaps of the attention probabilities of one layer (every head, or one) for a text."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

import numpy as np

from ..core.errors import BertforgeError
from ..core.io import atomic_write, check_output_file
from ..core.hub import model_path
from ..training.log import PLOTS_HINT, installed

NAME = "attention"
HELP = "draw a text's attention probabilities (all heads of a layer, or one head) as a grid of heatmaps"
EXAMPLES = (
    'bertforge attention --model runs/my-bert/model --text "The cat sat on the mat." --layer 1 --out attention.png',
)  # `--help` shows them; tests/test_cli.py parses them

FORMATS = ("png", "pdf", "svg", "jpg", "jpeg")
#: Longest text drawn (tokens): beyond it the labels of a heatmap cannot be read.
MAX_TOKENS = 128

log = logging.getLogger("bertforge")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory (any BERT checkpoint)")
    parser.add_argument("--text", required=True, help="the text to look at")
    parser.add_argument("--text-pair", default=None, metavar="TEXT", help="an optional second segment")
    parser.add_argument("--out", required=True, metavar="FILE", help=f"image file ({', '.join(FORMATS)})")
    parser.add_argument("--layer", type=int, default=-1, metavar="L",
                        help="layer, counted from 0 (negative counts from the end; default: the last)")
    parser.add_argument("--head", type=int, default=None, metavar="H", help="one head, counted from 0 (default: all heads)")


def attention_probabilities(model_dir: Path, text: str, text_pair: str | None) -> tuple[list[np.ndarray], list[str]]:
    """Each layer's attention probabilities [heads, S, S] for the text, and its tokens."""
    import torch

    from ..model import BertModel
    from ..model.checkpoint import load_pretrained
    from ..tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(model_dir)
    model = load_pretrained(BertModel, model_dir, quiet=True).eval()
    model.set_attn_implementation("eager")
    limit = min(MAX_TOKENS, model.config.max_sequence_length, tokenizer.model_max_length)
    enc = tokenizer(text, text_pair)
    if len(enc["input_ids"]) > limit:
        log.warning("attention: the text has %d tokens; drawing the first %d", len(enc["input_ids"]), limit)
        enc = tokenizer(text, text_pair, truncation=True, max_length=limit)
    ids = torch.tensor([enc["input_ids"]])
    types = torch.tensor([enc["token_type_ids"]])
    with torch.inference_mode():
        out = model(ids, token_type_ids=types, output_attentions=True)
    return [a[0].numpy() for a in out.attentions], list(tokenizer.convert_ids_to_tokens(enc["input_ids"]))


def draw(probs: np.ndarray, tokens: list[str], heads: list[int], layer: int, title: str, out: Path) -> None:
    """A grid of heatmaps, one per head in `heads`: rows = attending token, columns = attended token."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(heads)
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    size = len(tokens)
    cell = max(2.2, min(6.0, 0.16 * size + 1.2))  # inches per heatmap: labels need room as the text grows
    font = 9 if size <= 24 else 7 if size <= 48 else 5
    fig, axes = plt.subplots(rows, cols, figsize=(cols * cell + 1.4, rows * cell + 1.0), squeeze=False,
                             constrained_layout=True)
    vmax = float(probs[heads].max())
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.axis("off")
            continue
        image = ax.imshow(probs[heads[k]], cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.set_title(f"layer {layer}, head {heads[k]}", fontsize=font + 2)
        ax.set_xticks(range(size))
        ax.set_yticks(range(size))
        ax.set_xticklabels(tokens, rotation=90, fontsize=font)
        ax.set_yticklabels(tokens, fontsize=font)
        ax.tick_params(length=0)
    fig.suptitle(title, fontsize=11)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention probability (row attends to column)")  # type: ignore[arg-type]  # n >= 1
    fmt = out.suffix.lower().lstrip(".")

    def write(tmp: Path) -> None:
        fig.savefig(tmp, format="jpeg" if fmt == "jpg" else fmt, dpi=130)

    try:
        atomic_write(out, write)
    finally:
        plt.close(fig)


def run(args: argparse.Namespace) -> int:
    if not installed("matplotlib"):  # checked first: nothing loaded, nothing written
        raise BertforgeError(f"attention draws with matplotlib, which is not installed: {PLOTS_HINT}")
    out = Path(args.out)
    if out.suffix.lower().lstrip(".") not in FORMATS:
        raise BertforgeError(f"{out}: the image file name must end in one of: {', '.join('.' + f for f in FORMATS)}")
    model_dir = model_path(args.model)
    if not model_dir.is_dir():
        raise BertforgeError(f"{model_dir}: no such model directory")
    check_output_file(out, model=model_dir)
    if not args.text.strip():
        raise BertforgeError("--text is empty")
    layers, tokens = attention_probabilities(model_dir, args.text, args.text_pair)
    n_layers, n_heads = len(layers), layers[0].shape[0]
    if not -n_layers <= args.layer < n_layers:
        raise BertforgeError(f"--layer {args.layer} is out of range: the model has {n_layers} layers (0..{n_layers - 1})")
    layer = args.layer % n_layers
    if args.head is not None and not 0 <= args.head < n_heads:
        raise BertforgeError(f"--head {args.head} is out of range: the model has {n_heads} heads (0..{n_heads - 1})")
    heads = list(range(n_heads)) if args.head is None else [args.head]
    shown = args.text if len(args.text) <= 80 else args.text[:77] + "..."
    draw(layers[layer], tokens, heads, layer, f"{model_dir.name}: {shown!r}", out)
    print(f"layer {layer}, {'all ' + str(n_heads) + ' heads' if args.head is None else 'head ' + str(args.head)}, "
          f"{len(tokens)} tokens -> {out}", file=sys.stderr)
    return 0
