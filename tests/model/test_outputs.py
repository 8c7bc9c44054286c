"""Model outputs read like `transformers`': by name, by key, by position over the fields that are set."""

import torch

from bertforge.model import MaskedLMOutput, SequenceClassifierOutput


def test_fields_by_name_key_and_position_skip_what_is_unset():
    loss, logits = torch.tensor(1.5), torch.zeros(2, 3)
    out = SequenceClassifierOutput(loss=loss, logits=logits)
    assert out["loss"] is loss and out.logits is logits
    assert out.keys() == ["loss", "logits"]
    assert out[0] is loss and out[1] is logits and len(out.to_tuple()) == 2
    no_loss = SequenceClassifierOutput(logits=logits)
    assert no_loss[0] is logits and no_loss.keys() == ["logits"]


def test_masked_lm_output_answers_to_pretraining_names():
    out = MaskedLMOutput(loss=torch.tensor(2.0), logits=torch.ones(4, 7))
    assert out.mlm_loss is out.loss and out.prediction_logits is out.logits
    assert out.nsp_loss is None and out.seq_relationship_logits is None
