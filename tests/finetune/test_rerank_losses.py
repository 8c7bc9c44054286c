"""`bertforge.finetune.rerank_losses`: every reranking loss equals sentence-transformers' CrossEncoder loss of that
name on the same model, pairs and labels (ragged rows for the listwise ones)."""

from __future__ import annotations


import pytest
import torch

from bertforge.finetune.rerank_losses import RERANK_LOSSES

NAMES = ["john", "mary", "peter"]
PLACES = ["paris", "london", "berlin"]
DOCS = {n: f"{n} lives in {p}" for n, p in zip(NAMES, PLACES)}
OFF_TOPIC = "the movie was very bad"


def bertforge_logits(directory, pairs):
    from bertforge.finetune.features import collate
    from bertforge.model import BertForSequenceClassification
    from bertforge.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_pretrained(directory)
    model = BertForSequenceClassification.from_pretrained(directory, quiet=True).eval()
    encoded = tokenizer([q for q, _ in pairs], [d for _, d in pairs], truncation=True, max_length=64)
    batch = collate([{"input_ids": i, "token_type_ids": t} for i, t in zip(encoded["input_ids"],
                                                                           encoded["token_type_ids"])], 0)
    with torch.no_grad():
        return model(**batch).logits.view(-1).double()


@pytest.mark.parametrize("name", ["bce", "mse", "listnet", "lambdaloss"])
def test_each_loss_is_sentence_transformers_loss(name, cross_encoder_dir):
    """The same model, rows and labels: bertforge's loss of the logits equals sentence-transformers' loss class of
    the same name (ragged rows for the listwise ones: padding must weigh nothing)."""
    from sentence_transformers.cross_encoder import CrossEncoder, losses

    ce = CrossEncoder(str(cross_encoder_dir), num_labels=1)
    ce.model.eval()
    rows = [("where does john live ?", [DOCS["john"], DOCS["mary"], OFF_TOPIC], [1.0, 0.3, 0.0]),
            ("where does mary live ?", [DOCS["peter"], DOCS["mary"]], [0.0, 1.0]),
            ("who is peter ?", [OFF_TOPIC, DOCS["john"], DOCS["peter"], DOCS["mary"]], [0.0, 0.2, 1.0, 0.1])]
    pairs = [(q, d) for q, docs, _ in rows for d in docs]
    labels = torch.tensor([v for _, _, ls in rows for v in ls], dtype=torch.float64)
    sizes = [len(docs) for _, docs, _ in rows]
    ours = RERANK_LOSSES[name].fn(bertforge_logits(cross_encoder_dir, pairs), sizes if name in ("listnet", "lambdaloss")
                                  else [1] * len(pairs), labels)
    with torch.no_grad():
        if name in ("bce", "mse"):
            reference_loss = {"bce": losses.BinaryCrossEntropyLoss, "mse": losses.MSELoss}[name](ce)
            theirs = reference_loss([[q for q, _ in pairs], [d for _, d in pairs]], labels.float())
        else:
            reference_loss = {"listnet": losses.ListNetLoss, "lambdaloss": losses.LambdaLoss}[name](ce)
            theirs = reference_loss([[q for q, _, _ in rows], [d for _, d, _ in rows]],
                                    [torch.tensor(ls) for _, _, ls in rows])
    assert abs(float(ours) - float(theirs)) < 1e-5, (name, float(ours), float(theirs))
