"""Tests of `bertforge.model.card`: every saved model directory carries a README.md model card that the Hub reads
(YAML metadata) and a person reads; a README.md that bertforge did not write is never replaced."""

from __future__ import annotations

import pytest

from bertforge.model.card import MARKER, ModelCard
from bertforge.model.models import BertForMaskedLM, BertForSequenceClassification
from tests.helpers import tiny_config


def front_matter(text: str) -> dict[str, str]:
    head = text.split("---\n")[1]
    return {line.split(":")[0]: line.split(":", 1)[1].strip() for line in head.splitlines() if ": " in line}


def test_save_pretrained_writes_a_card_that_transformers_ignores(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = BertForSequenceClassification(tiny_config(num_labels=2))
    model.save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text(encoding="utf-8")
    meta = front_matter(card)
    assert meta == {"library_name": "transformers", "pipeline_tag": "text-classification"}
    assert "- bertforge\n- bert\n" in card and MARKER in card
    assert f"{sum(p.numel() for p in model.parameters()):,} parameters" in card
    assert "AutoModelForSequenceClassification.from_pretrained" in card
    transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path)  # the card is not in its way


def test_card_metadata_names_hub_ids_only_and_the_results(tmp_path):
    local = tmp_path / "my-base"
    local.mkdir()
    model = BertForMaskedLM(tiny_config())
    model.save_pretrained(tmp_path / "a", ModelCard(base_model="google-bert/bert-base-uncased", datasets=("wikitext",),
                                                    metrics={"eval_loss": 1.23456}, metrics_on="held-out text"))
    card = (tmp_path / "a" / "README.md").read_text(encoding="utf-8")
    assert front_matter(card)["base_model"] == "google-bert/bert-base-uncased"
    assert front_matter(card)["pipeline_tag"] == "fill-mask"
    assert "| eval_loss | 1.2346 |" in card and "On held-out text:" in card
    model.save_pretrained(tmp_path / "b", ModelCard(base_model=str(local)))
    card = (tmp_path / "b" / "README.md").read_text(encoding="utf-8")
    assert "base_model" not in front_matter(card) and f"- started from: `{local}`" in card
    pinned = "google-bert/bert-base-uncased@" + "a" * 40  # what a run records of a Hub id: the commit it took
    model.save_pretrained(tmp_path / "c", ModelCard(base_model=pinned))
    card = (tmp_path / "c" / "README.md").read_text(encoding="utf-8")
    assert front_matter(card)["base_model"] == "google-bert/bert-base-uncased" and f"- started from: `{pinned}`" in card


def test_a_readme_someone_wrote_is_kept_and_ours_is_replaced(tmp_path):
    model = BertForMaskedLM(tiny_config())
    (tmp_path / "README.md").write_text("# my notes\n", encoding="utf-8")
    model.save_pretrained(tmp_path)
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == "# my notes\n"
    other = tmp_path / "ours"
    model.save_pretrained(other, ModelCard(metrics={"x": 1.0}))
    model.save_pretrained(other)  # saved again: bertforge's own card is rewritten
    assert "## Results" not in (other / "README.md").read_text(encoding="utf-8")
