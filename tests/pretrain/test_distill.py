"""Distillation into a DistilBERT (or, from a DeBERTa or ModernBERT teacher, a student of its own family): the
student's initialisation from the teacher, an exact resume, refusals (the run through the CLI, which learns and which
`transformers` loads: tests/commands/test_distill.py; a DeBERTa teacher's student loaded by `transformers`: here)."""

import pytest
import torch

import bertforge
from bertforge import BertforgeError
from bertforge.cli import main
from bertforge.pretrain.distill import DistillArgs, init_from_teacher, teacher_layers
from bertforge.model import BertForMaskedLM
from tests.helpers import make_run_inputs

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """(corpus, tokenizer dir) for tiny runs."""
    corpus, tok, _ = make_run_inputs(tmp_path_factory.mktemp("inputs"))
    return corpus, tok


def make_teacher(directory, tok_dir, family="bert", layers=4):
    from bertforge.tokenizer import Tokenizer

    tok = Tokenizer.from_pretrained(tok_dir)
    sizes = dict(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                 intermediate_size=48, max_position_embeddings=66, pad_token_id=tok.pad_token_id)
    extra = {  # DeBERTa-v3's attention (relative, log buckets, shared keys); ModernBERT's ids (its layers alternate)
        "deberta": dict(relative_attention=True, position_biased_input=False, pos_att_type=["p2c", "c2p"],
                        position_buckets=16, max_relative_positions=64, share_att_key=True, norm_rel_ebd="layer_norm"),
        "modernbert": dict(cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id,
                           eos_token_id=tok.sep_token_id, global_attn_every_n_layers=3, local_attention=8),
    }.get(family, {})
    prefix = {"bert": "Bert", "roberta": "Roberta", "deberta": "DebertaV2", "modernbert": "ModernBert", "mpnet": "MPNet",
              "nomic_bert": "NomicBert", "gte": "Gte", "eurobert": "EuroBert",
              "jina_embeddings_v3": "JinaEmbeddingsV3",
              "electra": "Electra"}[family]
    if family == "electra":  # E < H: the student keeps the projection
        extra = dict(embedding_size=16)
    config = getattr(transformers, prefix + "Config")(**sizes, **extra)
    cls = getattr(transformers, prefix + "ForMaskedLM")
    torch.manual_seed(0)
    cls(config).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def test_teacher_layers_are_every_other_one():
    assert teacher_layers(6, 12) == [0, 2, 4, 6, 8, 10]
    assert teacher_layers(1, 2) == [0]
    assert teacher_layers(4, 4) == [0, 1, 2, 3]


@pytest.mark.parametrize("family", ["bert", "roberta", "deberta", "modernbert", "mpnet", "nomic_bert", "gte",
                                    "eurobert", "jina_embeddings_v3", "electra"])
def test_a_full_depth_student_computes_what_the_teacher_does(tmp_path, inputs, family):
    """With as many layers as the teacher, the copied student is the teacher without token types: the token-type
    row folded into the positions (and RoBERTa's offset skipped) keeps every output on single segments. A DeBERTa
    or ModernBERT teacher's student is of its own family, every weight copied."""
    teacher_dir = make_teacher(tmp_path / "teacher", inputs[1], family)
    teacher = bertforge.AutoModelForMaskedLM.from_pretrained(teacher_dir).eval()
    args = DistillArgs(teacher=str(teacher_dir), corpus=[str(inputs[0])], student_layers=4, max_length=32)
    student = BertForMaskedLM(args.model_config())
    init_from_teacher(student, teacher)
    student.eval()
    if family in ("deberta", "modernbert", "mpnet", "nomic_bert", "gte", "eurobert", "jina_embeddings_v3", "electra"):  # MPNet's bias table, rotary positions
        assert student.config.model_type == teacher.config.model_type
    else:
        assert student.config.model_type == "distilbert" and student.bert.embeddings.token_type_embeddings is None
    ids = torch.randint(5, teacher.config.vocab_size, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    ids = ids.masked_fill(mask == 0, teacher.config.pad_token_id)
    with torch.no_grad():
        expected, got = teacher(ids, mask).logits, student(ids, mask).logits
    assert (expected - got)[mask.bool()].abs().max() <= 1e-5


def test_a_modernbert_student_keeps_each_copied_layers_attention(tmp_path, inputs):
    """Student layer i is teacher layer 2i with its own attention kind: teacher layers global, local, local, global,
    local, local (one global in three) → a 3-layer student of layers 0, 2, 4: global, local, local; weights copied."""
    from bertforge.model.families.modernbert import GLOBAL, LOCAL, layer_types

    teacher_dir = make_teacher(tmp_path / "teacher", inputs[1], "modernbert", layers=6)
    teacher = bertforge.AutoModelForMaskedLM.from_pretrained(teacher_dir).eval()
    config = DistillArgs(teacher=str(teacher_dir), corpus=[str(inputs[0])], max_length=32).model_config()
    assert layer_types(teacher.config) == [GLOBAL, LOCAL, LOCAL, GLOBAL, LOCAL, LOCAL]
    assert config.num_hidden_layers == 3 and layer_types(config) == [GLOBAL, LOCAL, LOCAL]
    student = BertForMaskedLM(config)
    init_from_teacher(student, teacher)
    assert [student.config.spec.layer(i).window for i in range(3)] == [None, 8, 8]  # local: a sliding window
    for block, index in zip(student.blocks(), [0, 2, 4]):
        theirs = teacher.blocks()[index].state_dict()
        assert all(torch.equal(v, theirs[k]) for k, v in block.state_dict().items())


def test_a_deberta_teacher_gives_a_deberta_student_that_transformers_loads(tmp_path, inputs, capsys):
    """`bertforge distill` from a DeBERTa-v3-shaped teacher: a 2-layer DeBERTa-v2 student that `transformers` loads
    with no missing or unexpected weights and whose logits match ours; `--packing documents` is refused (the cosine
    loss needs every token's hidden state)."""
    corpus, tok = inputs
    teacher = make_teacher(tmp_path / "teacher", tok, "deberta")
    argv = ["distill", "--teacher", str(teacher), "--corpus", str(corpus), "--max-length", "32", "--max-steps", "2",
            "--batch-size", "4", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "documents"), "--packing", "documents"]) != 0
    assert "--packing documents gives no per-token hidden states" in capsys.readouterr().err
    assert not (tmp_path / "documents").exists()
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    model_dir = tmp_path / "run" / "model"
    reference, info = transformers.DebertaV2ForMaskedLM.from_pretrained(model_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert reference.config.num_hidden_layers == 2 and reference.config.relative_attention
    ours = bertforge.AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    ids = torch.randint(5, reference.config.vocab_size, (2, 10))
    with torch.no_grad():
        assert (ours(ids).logits - reference.eval()(ids).logits).abs().max() <= 1e-5


def test_distillation_resumes_exactly(tmp_path, inputs, monkeypatch):
    corpus, tok = inputs
    teacher_dir = make_teacher(tmp_path / "teacher", tok)
    from bertforge.pretrain.distill import distill

    common = dict(teacher=str(teacher_dir), corpus=[str(corpus)], batch_size=4, max_length=32, max_steps=6, save_every=3,
                  warmup_steps=1, decay="constant", progress=False, demo=False)
    whole = distill(DistillArgs(out=str(tmp_path / "whole"), **common))
    part = tmp_path / "part"
    distill(DistillArgs(out=str(part), **{**common, "max_steps": 3}))
    resumed = distill(DistillArgs(out=str(part), resume=True, **common))
    from safetensors.torch import load_file

    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_teachers_that_cannot_be_distilled_are_refused(tmp_path, inputs, capsys):
    corpus, tok = inputs
    teacher = make_teacher(tmp_path / "teacher", tok)
    headless = tmp_path / "headless"
    bertforge.AutoModel.from_pretrained(teacher).save_pretrained(headless)  # the encoder alone: no MLM head
    bertforge.Tokenizer.from_pretrained(teacher).save_pretrained(headless)
    assert main(["distill", "--teacher", str(headless), "--corpus", str(corpus), "--out", str(tmp_path / "o1"),
                 "--max-length", "32", "--max-steps", "1", "--no-progress"]) != 0
    assert "no MLM head" in capsys.readouterr().err
    with pytest.raises(BertforgeError, match="--teacher is required"):
        DistillArgs(corpus=[str(corpus)]).validate()
    with pytest.raises(BertforgeError, match="--student-layers 9 is more"):
        DistillArgs(teacher=str(teacher), corpus=[str(corpus)], student_layers=9).model_config()


@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_the_three_losses_equal_their_formulas_written_out(temperature):
    """`Distillation.forward_backward` hands the step α_ce · T² · KL(softmax(t/T) ‖ softmax(s/T)) averaged over the
    masked positions, α_mlm · the student's MLM loss and α_cos · (1 - cos) of the last hidden states averaged over
    the real tokens; here each is computed by hand in float64 from stand-in models' outputs."""
    import contextlib
    from types import SimpleNamespace

    from bertforge.pretrain.distill import Distillation

    g = torch.Generator().manual_seed(0)
    n_masked, vocab, hidden = 5, 11, 6
    labels = torch.full((2, 4), -100)
    labels[0, :3], labels[1, 1:3] = torch.tensor([3, 7, 1]), torch.tensor([2, 9])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    batch = {"input_ids": torch.zeros(2, 4, dtype=torch.long), "attention_mask": mask,
             "token_type_ids": torch.zeros(2, 4, dtype=torch.long), "labels": labels}
    s_logits, t_logits = torch.randn(n_masked, vocab, generator=g) * 3, torch.randn(n_masked, vocab, generator=g) * 3
    s_hidden, t_hidden = torch.randn(2, 4, hidden, generator=g), torch.randn(2, 4, hidden, generator=g)
    mlm = torch.tensor(2.5)

    class StandIn(torch.nn.Module):
        def __init__(self, logits, hidden_state, loss=None):
            super().__init__()
            self.out = SimpleNamespace(logits=logits, hidden_states=(hidden_state * 0, hidden_state), loss=loss)

        def forward(self, **inputs):
            assert inputs["output_hidden_states"] and torch.equal(inputs["labels"], labels)
            return self.out

    class Stepper:
        autocast = staticmethod(contextlib.nullcontext)

        def accumulate(self, losses, weights):
            self.losses = losses
            return sum(losses.values()).detach()

    stepper = Stepper()
    objective = Distillation(StandIn(t_logits, t_hidden), temperature, alpha_ce=5.0, alpha_mlm=2.0, alpha_cos=0.5)
    objective.forward_backward(StandIn(s_logits, s_hidden, mlm), stepper, batch, {"ce": 1.0, "mlm": 1.0, "cos": 1.0})

    T = temperature
    def log_softmax(z):
        z = z.double() / T
        return z - torch.log(torch.exp(z - z.amax(-1, keepdim=True)).sum(-1, keepdim=True)) - z.amax(-1, keepdim=True)

    p_teacher = torch.exp(log_softmax(t_logits))
    kl = (p_teacher * (log_softmax(t_logits) - log_softmax(s_logits))).sum(-1).mean()  # per masked position
    real = mask.bool()
    a, b = s_hidden[real].double(), t_hidden[real].double()
    cos = (1 - (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))).mean()
    got = {k: float(v) for k, v in stepper.losses.items()}
    assert got["ce"] == pytest.approx(5.0 * T * T * float(kl), rel=1e-5)
    assert got["mlm"] == pytest.approx(2.0 * 2.5, rel=1e-6)
    assert got["cos"] == pytest.approx(0.5 * float(cos), rel=1e-5)
    assert objective.counts(batch) == {"mlm": 5, "ce": 5, "cos": 7}
