"""`bertforge.pretrain.registry`: the objectives `--objective` names, one table of entries that say everything a run
needs of them, so the pretrainer, its builders and its settings never compare objective names."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from bertforge.core.errors import BertforgeError
from bertforge.core.system import Runtime
from bertforge.data.instances import SENTENCE_OBJECTIVES
from bertforge.model.config import BertConfig
from bertforge.model.families import FAMILIES
from bertforge.pretrain.args import PretrainArgs
from bertforge.pretrain.data import model_inputs
from bertforge.pretrain.objectives import MLM, MaskedLMObjective, Objective, ObjectiveKind, masked_lm
from bertforge.pretrain.registry import OBJECTIVES, objective_kind
from bertforge.pretrain.trainer import Pretrainer
from bertforge.training.optim import make_optimizer, warmup_decay
from bertforge.training.step import TrainStep
from tests.helpers import make_run_inputs, metrics_rows, tiny_config, tiny_run_args

CPU = Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
#: a family each registered objective pretrains (a new entry adds its line, or this test names the gap)
MEMBER = {"mlm": "tiny", "nsp": "tiny", "sop": "albert-tiny", "rtd": "deberta-v3-tiny"}


def config_of(preset: str) -> BertConfig:
    return dataclasses.replace(BertConfig.preset(preset), vocab_size=120)


def batch(sentence: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(5, 100, (4, 16))
    labels = torch.full_like(ids, -100)
    labels[:, 3], labels[:2, 7] = ids[:, 3], ids[:2, 7]
    ids[labels != -100] = 4  # [MASK]
    out = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
           "labels": labels}
    if sentence:
        out["next_sentence_label"] = torch.tensor([0, 1, 1, 0])
    return out


def test_names_are_the_entries_and_the_command_lines_choices():
    assert list(OBJECTIVES) == ["mlm", "nsp", "sop", "rtd"]
    assert all(kind.name == name for name, kind in OBJECTIVES.items())
    choices = next(f for f in dataclasses.fields(PretrainArgs) if f.name == "objective").metadata["cli"]["choices"]
    assert list(choices) == ["auto", *OBJECTIVES] and "rtd" in choices and "electra" not in choices


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_every_entry_is_complete_builds_its_model_and_trains_a_step(name):
    """What each entry declares holds together: its data needs are ones the data layer has, its own settings are
    settings, a family pretrains with it and another refuses it or none does, and what it builds trains a step,
    logs, evaluates and exports the networks it names."""
    kind = OBJECTIVES[name]
    assert kind.sentence in (None, *SENTENCE_OBJECTIVES)
    assert not (kind.packs_documents and kind.sentence), "rows of whole documents have no sentence pairs"
    mask, random_token = kind.mask_replacement
    assert 0 <= mask and 0 <= random_token and mask + random_token <= 1
    fields = {f.name: f for f in dataclasses.fields(PretrainArgs)}
    assert all(setting in fields and fields[setting].default is None for setting in kind.settings)
    config = config_of(MEMBER[name])
    assert kind.refusal(config.family) is None
    refusals = {member.name: kind.refusal(member) for member in FAMILIES.values()}
    assert all(reason is None or isinstance(reason, str) and member in reason for member, reason in refusals.items())
    sized = kind.memory_config(config, PretrainArgs(objective=name))
    assert sized.hidden_size == config.hidden_size and sized.num_hidden_layers >= config.num_hidden_layers

    model, objective = kind.build(config, PretrainArgs(objective=name), False, CPU)
    assert isinstance(objective, Objective)
    b = batch(kind.sentence is not None)
    optimizer = make_optimizer(model, "adamw", 1e-3, 0.01)
    step = TrainStep(model, optimizer, warmup_decay(optimizer, 1, 10), max_grad_norm=1.0, device=torch.device("cpu"))
    outcome = step.run([b], lambda x, w: objective.forward_backward(model, step, x, w), objective.counts)
    first, rest = objective.statistics(outcome.totals)
    assert "mlm_loss" in first and torch.isfinite(outcome.totals["loss"])
    assert ("nsp_accuracy" in rest) == (kind.sentence is not None)
    model.eval()
    with torch.no_grad():
        results = objective.eval_results(objective.eval_sums(model(**model_inputs(b)), b))
        logits = objective.masked_logits(model(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"]))
    assert results["eval_loss"] > 0 and logits.shape == (4, 16, 120)
    exports = objective.exports(model, model.state_dict(), config)
    assert exports.keys() == objective.networks(model).keys() and "" in exports


def test_an_unknown_objective_is_refused_naming_the_registered_ones():
    with pytest.raises(BertforgeError, match=r"unknown objective 'electra'; the registered objectives are "
                                             r"mlm, nsp, sop, rtd$"):
        objective_kind("electra")
    with pytest.raises(BertforgeError, match=r"objective must be one of auto, mlm, nsp, sop, rtd, got 'electra'"):
        PretrainArgs(objective="electra").validate()


class HalfMLM(MaskedLMObjective):
    """A new objective: MLM at half weight, with a metric of its own and a second network exported."""

    def forward_backward(self, model, stepper, batch, weights):
        with stepper.autocast():
            out = model(**model_inputs(batch))
        loss = stepper.accumulate({"mlm": 0.5 * out.mlm_loss}, weights)
        stats = {"loss": loss, "tokens": batch["attention_mask"].sum(),
                 "half_masked": (batch["input_ids"] == 4).sum() / batch["labels"].ne(-100).sum().clamp(min=1)}
        return stats

    def statistics(self, totals):
        return {"half_loss": totals["loss"].item()}, {"all_masked": totals["half_masked"].item()}

    def exports(self, model, weights, config):
        return {**super().exports(model, weights, config), "copy": super().exports(model, weights, config)[""]}


def test_a_new_objective_registered_here_runs_through_the_pretrainer(tmp_path, monkeypatch):
    """An entry added to the table (no change to the trainer, the builders or the settings) is a choice, refuses
    the families it names, sizes the memory check, shapes the data (all [MASK]) and trains, logs and exports as
    its objective says."""
    seen = []

    def memory(config, args):
        seen.append(config.num_hidden_layers)
        return config

    def refusal(family):
        return None if family.sentence_head == "NSP" else f"{family.name} has no NSP head to ignore"

    toy = ObjectiveKind("toy", lambda config, args, resuming, rt: (masked_lm(config, args, resuming, rt)[0], HalfMLM()),
                        memory_config=memory, mask_replacement=(1.0, 0.0), refusal=refusal)
    monkeypatch.setitem(OBJECTIVES, "toy", toy)
    inputs = make_run_inputs(tmp_path / "in")
    with pytest.raises(BertforgeError, match="--objective toy contradicts --config roberta-tiny: RoBERTa has no NSP"):
        Pretrainer(tiny_run_args(inputs, tmp_path / "refused", objective="toy", config="roberta-tiny", tokenizer=None))
    out = tmp_path / "run"
    trainer = Pretrainer(tiny_run_args(inputs, out, objective="toy", max_steps=4, log_every=2, save_every=4))
    assert trainer.kind is toy and isinstance(trainer.objective, HalfMLM) and seen == [2]
    assert trainer.args.sentence_objective is None and trainer.args.packing == "stream"
    trainer.run()
    trainer.finish()
    rows = [r for r in metrics_rows(out) if "half_loss" in r]
    assert [r["step"] for r in rows] == [2, 4] and all(r["all_masked"] == 1.0 for r in rows)
    assert list(rows[0])[:3] == ["step", "loss", "half_loss"]
    assert (out / "model" / "model.safetensors").is_file() and (out / "copy" / "model.safetensors").is_file()
    assert json.loads((out / "model" / "config.json").read_text())["num_hidden_layers"] == 2


def test_the_mlm_entry_freezes_a_sentence_head_it_does_not_train():
    """MLM alone on a family with a sentence head (BERT): the model keeps the head (BertForPreTraining's layout),
    frozen, since DDP wants a gradient for every trainable weight; NSP trains it."""
    model, objective = MLM.build(tiny_config(), PretrainArgs(objective="mlm"), False, CPU)
    assert type(objective) is MaskedLMObjective and objective.sentence is None
    assert objective.networks(model) == {"": model}
    head = [p for module in model.sentence_head_parts() for p in module.parameters()]
    assert head and not any(p.requires_grad for p in head)
    model, objective = OBJECTIVES["nsp"].build(tiny_config(), PretrainArgs(objective="nsp"), False, CPU)
    assert objective.sentence == "nsp" and all(p.requires_grad for m in model.sentence_head_parts() for p in m.parameters())


def test_a_family_declares_the_objectives_it_pretrains_besides_its_heads():
    """Replaced-token detection asks the family (`Family.objectives`), not its model_type."""
    from bertforge.model.families import BERT, DEBERTA_V2
    from bertforge.pretrain.rtd import RTD

    assert RTD.refusal(DEBERTA_V2) is None and "not BERT's" in RTD.refusal(BERT)
    assert RTD.refusal(dataclasses.replace(BERT, objectives=("rtd",))) is None
