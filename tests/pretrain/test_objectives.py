"""`bertforge.pretrain.objectives`: an objective runs a micro-batch through the model and hands its loss terms to
`TrainStep`, says what they average over, turns a step's sums into its metrics, and reads the logits the demo and
the held-out evaluation need, so that the trainer never names a model output's fields."""

from __future__ import annotations

import torch

from bertforge.model import BertForMaskedLM, BertForPreTraining
from bertforge.training.optim import make_optimizer, warmup_decay
from bertforge.pretrain.objectives import MaskedLMObjective, pretraining_counts
from bertforge.training.step import TrainStep
from tests.helpers import tiny_config


def batch(nsp: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(5, 100, (4, 16))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    labels[:2, 7] = ids[:2, 7]
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
           "labels": labels}
    if nsp:
        out["next_sentence_label"] = torch.tensor([0, 1, 1, 0])
    return out


def stepper(model) -> TrainStep:
    optimizer = make_optimizer(model, "adamw", 1e-3, 0.01)
    return TrainStep(model, optimizer, warmup_decay(optimizer, 1, 10), max_grad_norm=1.0, device=torch.device("cpu"))


def test_counts_are_masked_tokens_and_labelled_sequences():
    assert MaskedLMObjective().counts(batch(False)) == {"mlm": 6} == pretraining_counts(batch(False))
    assert MaskedLMObjective("nsp").counts(batch(True)) == {"mlm": 6, "nsp": 4}


def test_an_mlm_and_nsp_step_gives_the_metrics_pretraining_logs():
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config())
    objective, step = MaskedLMObjective("nsp"), stepper(model)
    outcome = step.run([batch(True)], lambda b, w: objective.forward_backward(model, step, b, w), objective.counts)
    first, rest = objective.statistics(outcome.totals)
    assert list(first) == ["mlm_loss", "mlm_accuracy"] and list(rest) == ["nsp_accuracy", "nsp_loss"]
    assert 0 <= first["mlm_accuracy"] <= 1 and 0 <= rest["nsp_accuracy"] <= 1
    total = outcome.totals["loss"].item()
    assert abs(total - (first["mlm_loss"] + rest["nsp_loss"])) < 1e-5  # the step's loss is the sum of its terms
    assert int(outcome.totals["tokens"]) == 64


def test_masked_logits_and_eval_sums_read_the_models_output():
    torch.manual_seed(0)
    b = batch(False)
    model = BertForMaskedLM(tiny_config()).eval()
    with torch.no_grad():
        dense = model(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"])
        sparse = model(**b)
    assert MaskedLMObjective.masked_logits(dense).shape == (4, 16, 120)  # [B, S, V]
    sums = MaskedLMObjective.eval_sums(sparse, b)
    assert sums.dtype == torch.float64 and sums[2] == 6 and sums[4] == 0  # 6 masked tokens, no NSP
    assert abs(sums[0].item() / 6 - sparse.loss.item()) < 1e-4  # the summed loss is the mean loss x targets


def test_every_objective_trains_one_network_today():
    model = BertForMaskedLM(tiny_config())
    assert MaskedLMObjective().networks(model) == {"": model}
