"""The model card every saved model directory carries: README.md with the Hub's card metadata (YAML front matter:
library, pipeline tag, tags, base model, data sets, metrics) and a page a person reads (what the model is, how to load
it, how it was trained, its results). The Hub renders it as it renders any `transformers` model's card.

`save_pretrained` writes a card; trainers hand it what they know (`ModelCard`: the model they started from, their
data, their recipe, their metrics). A README.md that bertforge did not write (its first line is not `MARKER`'s) is
never replaced.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.hub import split_revision

CARD_NAME = "README.md"
MARKER = "<!-- model card written by bertforge: replaced when the model is saved again -->"

#: the Hub's pipeline tag of each model class
PIPELINE_TAGS = {
    "BertModel": "feature-extraction",
    "BertForPreTraining": "fill-mask",
    "BertForMaskedLM": "fill-mask",
    "BertForSequenceClassification": "text-classification",
    "BertForMultipleChoice": "multiple-choice",
    "BertForTokenClassification": "token-classification",
    "BertForQuestionAnswering": "question-answering",
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ModelCard:
    """What a trainer knows of the model it saves. `base_model`: the checkpoint it started from (a Hub id goes in the
    metadata, a local path only in the text); `datasets`: the files or data sets it trained on; `recipe`: settings
    worth repeating; `metrics`: name → value on `metrics_on`; `pipeline_tag` overrides the class's
    (sentence-similarity for an embedding model)."""

    base_model: str | None = None
    datasets: tuple[str, ...] = ()
    recipe: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_on: str | None = None
    pipeline_tag: str | None = None
    trained_by: str | None = None  # the bertforge command ("finetune", "pretrain", ...)
    library: str = "transformers"  # the Hub's library_name: what loads it ("sentence-transformers" for embeddings)


def card_text(model: Any, card: ModelCard, version: str) -> str:
    """README.md for `model` (a `BertPreTrainedModel`) described by `card`."""
    config = model.config
    name = type(model).__name__
    family = config.family
    tag = card.pipeline_tag or PIPELINE_TAGS.get(name, "feature-extraction")
    meta: list[str] = ["---", f"library_name: {card.library}", f"pipeline_tag: {tag}",
                       "tags:", "- bertforge", f"- {config.model_type}"]
    hub_base = split_revision(card.base_model)[0] if card.base_model else None  # a run's Hub id is pinned: @commit
    if hub_base and _HUB_ID.match(hub_base) and not Path(card.base_model or "").exists():
        meta.append(f"base_model: {hub_base}")
    hub_data = [d for d in card.datasets if _HUB_ID.match(d) and not Path(d).exists()]
    if hub_data:
        meta += ["datasets:"] + [f"- {d}" for d in hub_data]
    meta += ["---", MARKER, ""]
    params = sum(p.numel() for p in model.parameters())
    auto = "AutoModel" + name.removeprefix("BertModel").removeprefix("Bert")  # BertForMaskedLM -> AutoModelForMaskedLM
    lines = [f"# {Path(split_revision(card.base_model)[0]).name + ' → ' if card.base_model else ''}{family.name} {name}", "",
             f"A {family.name} encoder (`model_type: {config.model_type}`, `{name}`): {config.num_hidden_layers} layers, "
             f"hidden size {config.hidden_size}, {config.num_attention_heads} attention heads, a vocabulary of "
             f"{config.vocab_size:,} tokens, {params:,} parameters; written by bertforge {version}"
             + (f" (`bertforge {card.trained_by}`)." if card.trained_by else "."), "",
             "## Use", "", "```python", f"from transformers import {auto}, AutoTokenizer", "",
             'tokenizer = AutoTokenizer.from_pretrained("path/to/this/directory")',
             f'model = {auto}.from_pretrained("path/to/this/directory")', "```", "",
             "or with bertforge: `bertforge.pipeline(...)` and every `bertforge` command take this directory as "
             "`model` / `--model`.", ""]
    if card.base_model or card.datasets or card.recipe:
        lines += ["## Training", ""]
        if card.base_model:
            lines.append(f"- started from: `{card.base_model}`")
        if card.datasets:
            lines.append("- data: " + ", ".join(f"`{d}`" for d in card.datasets))
        lines += [f"- {key}: `{json.dumps(value)}`" for key, value in card.recipe.items()]
        lines.append("")
    if card.metrics:
        lines += ["## Results", "", f"On {card.metrics_on or 'the evaluation data'}:", "", "| metric | value |",
                  "| --- | --- |"] + [f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |"
                                      for k, v in card.metrics.items()] + [""]
    return "\n".join(meta + lines)


def may_write_card(directory: Path) -> bool:
    """Whether `directory`'s README.md is absent or bertforge's own (a card someone wrote is left alone)."""
    readme = Path(directory) / CARD_NAME
    if not readme.is_file():
        return True
    try:
        return MARKER in readme.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
