"""`bertforge pretrain`: train a BERT from raw text (MLM + NSP, or MLM alone with --no-nsp)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import add_run_config_argument

NAME = "pretrain"
HELP = "pretrain a BERT on your own corpus (with no arguments: a demo on the bundled corpus)"
EXAMPLES = (
    'bertforge pretrain   # the demo: a tiny BERT on the bundled corpus, two to four minutes on 2 CPU cores',
    'bertforge pretrain --corpus my_corpus/ --config mini --max-steps 10000 --eval-fraction 0.01 --out runs/my-bert',
    'bertforge pretrain --resume --out runs/my-bert   # continue it from its newest checkpoint',
)  # `--help` shows them; tests/test_cli.py parses them

def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..core.options import add_options
    from ..pretrain.args import DEMO, PRETRAINING, PretrainArgs

    add_run_config_argument(p, PRETRAINING)
    add_options(p, PretrainArgs, notes={name: f"demo {value}" for name, value in DEMO.items()})


def run(args: argparse.Namespace) -> int:
    """The settings given on the command line over those of --run-config (or, with --resume, of the run in --out)
    and the defaults (`pretrain.args.run_settings`: the demo's when no --corpus is given), as `pretrain(**settings)`
    resolves them from Python."""
    from ..data.decoding import warn_replaced
    from ..core.options import given
    from ..pretrain.args import PretrainArgs, run_settings, with_recorded_run
    from ..pretrain.trainer import pretrain
    from ..core.system import last_runtime

    final = pretrain(run_settings(with_recorded_run(given(args, PretrainArgs), args.run_config)))
    rt = last_runtime()  # the one the run set up
    if final is not None and (rt is None or rt.is_main):  # under torchrun, rank 0 speaks for the run
        replaced, passes = replaced_bytes(Path(final).parent)
        warn_replaced(replaced, passes=passes)
    return 0


def replaced_bytes(out: Path) -> tuple[int, int]:
    """(bytes, passes): the bytes of the corpus that were not UTF-8 (read as U+FFFD), summed over the ranks
    and over every pass the run made over the corpus (`passes`: the most any rank made), as the data state of the
    run's newest checkpoint counts them (or, with static masking, the shards' index); 0 when nothing tells."""
    from ..data.static import INDEX_NAME
    from ..core.errors import BertforgeError
    from ..pretrain.data import STATIC_DIR
    from ..training.run_dir import list_checkpoints
    from ..core.state import load_state

    total, passes = 0, 1
    for index in sorted((out / STATIC_DIR).glob(f"*/{INDEX_NAME}")):
        try:
            stats = json.loads(index.read_text(encoding="utf-8")).get("stats", {})
            total += int(stats.get("bytes_replaced", 0))
            passes = max(passes, int(stats.get("epoch", 0)) + 1)
        except (OSError, ValueError, TypeError, AttributeError):
            pass
    checkpoints = list_checkpoints(out)
    if total or not checkpoints:
        return total, passes
    try:
        states = load_state(checkpoints[-1][1], "data")
        for state in states:
            reader = state["instances"]["reader"]
            total += int(reader["stats"]["bytes_replaced"])
            passes = max(passes, int(reader["epoch"]) + 1)
    except (BertforgeError, KeyError, TypeError, ValueError):
        return 0, passes
    return total, passes
