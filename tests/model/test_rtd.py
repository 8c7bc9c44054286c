"""Replaced-token detection's model: gradient-disentangled embedding sharing (the RTD loss never reaches the
generator's embeddings), the folded export, the RTD head against its formula, its checkpoint keys, the generator's
depth; ELECTRA's generator shape and tied tables, and its head against `transformers`' ElectraForPreTraining."""

import pytest
import torch
import torch.nn.functional as F

from bertforge import BertforgeError
from bertforge.core.constants import IGNORE_INDEX
from bertforge.model import BertConfig, BertModel
from bertforge.model.rtd import BertForReplacedTokenDetection, ReplacedTokenDetection, generator_config

WORDS = "bert.embeddings.word_embeddings."


def tiny(layers: int = 2, **overrides) -> BertConfig:
    return BertConfig.preset("deberta-v3-tiny", vocab_size=50, hidden_size=32, num_attention_heads=2,
                             intermediate_size=64, num_hidden_layers=layers, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0, **overrides)


def batch(seed: int = 0):
    """A padded batch with 15 % of the real tokens masked (labels: their ids; inputs: [MASK], id 4)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 6:] = 0
    ids[mask == 0] = 0
    chosen = (torch.rand(ids.shape, generator=g) < 0.3) & (mask == 1)
    chosen[0, 1] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    return ids.masked_fill(chosen, 4), mask, labels


def test_the_rtd_loss_leaves_the_generator_embeddings_gradient_exactly_zero():
    torch.manual_seed(0)
    pair = ReplacedTokenDetection.build(tiny())
    with torch.no_grad():  # a non-zero residual, as after training
        pair.discriminator.bert.embeddings.word_embeddings.delta.normal_(std=0.02)
    ids, mask, labels = batch()
    out = pair(ids, mask, labels=labels)
    out.rtd_loss.backward()
    shared = pair.generator.input_embeddings()
    assert shared.grad is None or torch.count_nonzero(shared.grad) == 0
    assert all(p.grad is None or not p.grad.any() for p in pair.generator.parameters())  # nothing of the generator
    delta = pair.discriminator.bert.embeddings.word_embeddings.delta
    assert delta.grad is not None and delta.grad.abs().sum() > 0  # the residual learns instead

    pair.zero_grad(set_to_none=True)
    pair(ids, mask, labels=labels).mlm_loss.backward()  # the generator's own loss does reach E_G
    assert shared.grad is not None and shared.grad.abs().sum() > 0


def test_a_new_pair_starts_with_a_zero_residual_and_the_generator_half_as_deep():
    torch.manual_seed(0)
    pair = ReplacedTokenDetection.build(tiny(layers=4))
    table = pair.discriminator.bert.embeddings.word_embeddings
    assert not table.delta.any()
    assert pair.generator.config.num_hidden_layers == 2 and pair.discriminator.config.num_hidden_layers == 4
    assert pair.generator.config.hidden_size == pair.discriminator.config.hidden_size
    assert torch.equal(table.weight, pair.generator.input_embeddings())
    assert "discriminator.bert.embeddings.word_embeddings.delta" in pair.state_dict()
    assert not any(k.startswith("discriminator.") and k.endswith("word_embeddings.weight") for k in pair.state_dict())


def test_exported_discriminator_embeddings_are_eg_plus_edelta_and_it_computes_what_the_pair_did():
    torch.manual_seed(1)
    pair = ReplacedTokenDetection.build(tiny()).eval()
    with torch.no_grad():
        pair.discriminator.bert.embeddings.word_embeddings.delta.normal_(std=0.05)
    state = pair.state_dict()
    models = pair.exports({k: v.clone() for k, v in state.items()})
    expected = state["generator." + WORDS + "weight"] + state["discriminator." + WORDS + "delta"]
    assert torch.equal(models[""].state_dict()[WORDS + "weight"], expected)
    assert torch.equal(models["generator"].state_dict()[WORDS + "weight"], state["generator." + WORDS + "weight"])
    ids, mask, _ = batch(2)
    with torch.no_grad():
        assert torch.equal(models[""].eval()(ids, mask).logits, pair.discriminator(ids, mask).logits)
        assert torch.equal(models["generator"].eval()(ids, mask).logits, pair.generator(ids, mask).logits)


def test_samples_fill_the_masks_and_labels_mark_the_replaced_real_tokens():
    torch.manual_seed(3)
    pair = ReplacedTokenDetection.build(tiny())
    ids, mask, labels = batch(3)
    out = pair(ids, mask, labels=labels)
    masked = labels != IGNORE_INDEX
    assert out.rtd_labels[mask == 0].eq(IGNORE_INDEX).all()
    assert not out.rtd_labels[(mask == 1) & ~masked].any()  # unmasked tokens are originals
    assert out.prediction_logits.shape == (int(masked.sum()), 50)
    # an untrained generator's softmax is near uniform: its samples differ from the original almost always
    assert out.rtd_labels[masked].float().mean() > 0.8
    # drawn from the softmax, not its argmax: the same inputs give other samples with another seed
    torch.manual_seed(4)
    again = pair(ids, mask, labels=labels)
    assert not torch.equal(again.rtd_labels, out.rtd_labels) or not torch.equal(again.rtd_logits, out.rtd_logits)


def test_the_rtd_head_is_microsofts_formula():
    torch.manual_seed(5)
    model = BertForReplacedTokenDetection(tiny()).eval()
    ids, mask, _ = batch(5)
    with torch.no_grad():
        hidden = model.bert(ids, mask).last_hidden_state
        head = model.mask_predictions
        x = F.layer_norm(hidden[:, :1] + hidden, (32,), head.LayerNorm.weight, head.LayerNorm.bias, 1e-7)
        x = F.gelu(F.linear(x, head.dense.weight, head.dense.bias))
        expected = F.linear(x, head.classifier.weight, head.classifier.bias).squeeze(-1)
        torch.testing.assert_close(model(ids, mask).logits, expected, rtol=0, atol=1e-6)
        labels = torch.where(mask == 1, (ids % 2), torch.full_like(ids, IGNORE_INDEX))
        loss = model(ids, mask, labels=labels).loss
        real = mask == 1
        torch.testing.assert_close(loss, F.binary_cross_entropy_with_logits(expected[real], labels[real].float()),
                                   rtol=1e-5, atol=1e-6)


def test_the_head_is_saved_and_read_as_mask_predictions_microsofts_misspelling_too(tmp_path):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(6)
    model = BertForReplacedTokenDetection(tiny())
    model.save_pretrained(tmp_path / "d")
    saved = load_file(str(tmp_path / "d" / "model.safetensors"))
    assert {k for k in saved if k.startswith("mask_predictions.")} == {
        f"mask_predictions.{part}.{p}" for part in ("dense", "LayerNorm", "classifier") for p in ("weight", "bias")}
    back = BertForReplacedTokenDetection.from_pretrained(tmp_path / "d")
    assert not back.loading_info.missing_keys and not back.loading_info.unexpected_keys
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in model.state_dict().items())
    # Microsoft's code names the classifier `classifer`
    saved = {k.replace("classifier", "classifer") if k.startswith("mask_predictions") else k: v for k, v in saved.items()}
    save_file(saved, str(tmp_path / "d" / "model.safetensors"))
    spelt = BertForReplacedTokenDetection.from_pretrained(tmp_path / "d")
    assert not spelt.loading_info.missing_keys
    assert torch.equal(spelt.mask_predictions.classifier.weight, model.mask_predictions.classifier.weight)
    # a task model reads the encoder and leaves the head out
    assert BertModel.from_pretrained(tmp_path / "d").loading_info.unexpected_keys


@pytest.mark.parametrize("layers", [0, 3, -1, 2.5])
def test_a_generator_deeper_than_the_model_or_of_no_layers_is_refused_in_one_line(layers):
    with pytest.raises(BertforgeError, match=r"--generator-layers .*1 to 2 layers") as info:
        generator_config(tiny(), layers)
    assert "\n" not in str(info.value)


def test_continuing_a_discriminator_alone_gives_its_table_to_a_new_generator():
    torch.manual_seed(7)
    discriminator = BertForReplacedTokenDetection(tiny())
    table = discriminator.input_embeddings().detach().clone()
    pair = ReplacedTokenDetection.around(discriminator, None, 1)
    assert torch.equal(pair.generator.input_embeddings(), table)
    assert not pair.discriminator.bert.embeddings.word_embeddings.delta.any()
    assert torch.equal(pair.discriminator.input_embeddings(), table)  # the discriminator is unchanged

    generator = pair.generator
    with torch.no_grad():
        generator.input_embeddings().add_(0.5)
    again = ReplacedTokenDetection.around(BertForReplacedTokenDetection(tiny()), generator)  # with its generator
    own = again.discriminator.bert.embeddings.word_embeddings
    torch.testing.assert_close(own.weight, own.delta + generator.input_embeddings(), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- ELECTRA's recipe


def electra(**overrides) -> BertConfig:
    return BertConfig.preset("electra-tiny", vocab_size=50, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                             **overrides)


def test_electra_small_has_the_papers_sizes_and_a_generator_a_quarter_as_wide():
    config = BertConfig.preset("electra-small", vocab_size=100)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.intermediate_size,
            config.embedding_size) == (12, 256, 4, 1024, 128)
    generator = generator_config(config)
    assert (generator.num_hidden_layers, generator.hidden_size, generator.num_attention_heads,
            generator.intermediate_size, generator.embedding_size) == (12, 64, 1, 256, 128)
    assert generator_config(config, 3).num_hidden_layers == 3
    assert generator_config(tiny(layers=4)).hidden_size == 32  # DeBERTa-v3's: as wide, half as deep


def test_electra_pairs_share_the_token_and_position_tables_which_both_losses_train():
    torch.manual_seed(0)
    pair = ReplacedTokenDetection.build(electra())
    gen, disc = pair.generator.bert.embeddings, pair.discriminator.bert.embeddings
    for table in ("word_embeddings", "position_embeddings"):
        assert getattr(disc, table).weight is getattr(gen, table).weight
    assert disc.token_type_embeddings.weight is not gen.token_type_embeddings.weight  # each its own
    state = pair.state_dict()
    assert not any(k.startswith("discriminator.bert.embeddings.") and "_embeddings.weight" in k
                   and "token_type" not in k for k in state)  # held once, under the generator
    assert len({id(p) for p in pair.parameters()}) == len(list(pair.parameters()))
    ids, mask, labels = batch()
    pair(ids, mask, labels=labels).rtd_loss.backward()  # the discriminator's loss reaches the shared tables
    assert gen.word_embeddings.weight.grad.abs().sum() > 0 and gen.position_embeddings.weight.grad.abs().sum() > 0
    assert all(p.grad is None or not p.grad.any() for n, p in pair.generator.named_parameters()
               if "embeddings." not in n)  # and nothing else of the generator


def test_an_exported_electra_discriminator_holds_the_shared_tables_and_computes_what_the_pair_did():
    torch.manual_seed(1)
    pair = ReplacedTokenDetection.build(electra()).eval()
    state = pair.state_dict()
    models = pair.exports({k: v.clone() for k, v in state.items()})
    for table in ("word_embeddings", "position_embeddings"):
        key = f"bert.embeddings.{table}.weight"
        assert torch.equal(models[""].state_dict()[key], state["generator." + key])
    ids, mask, _ = batch(2)
    with torch.no_grad():
        assert torch.equal(models[""].eval()(ids, mask).logits, pair.discriminator(ids, mask).logits)
        assert torch.equal(models["generator"].eval()(ids, mask).logits, pair.generator(ids, mask).logits)
    discriminator = models[""]
    again = ReplacedTokenDetection.around(discriminator, models["generator"])  # continuing keeps its tables
    assert torch.equal(again.discriminator.input_embeddings(), state["generator." + WORDS + "weight"])


def test_the_electra_head_is_transformers_discriminator_predictions_loss_included(tmp_path):
    """ElectraForPreTraining: dense → hidden activation → one logit per token, no norm; the BCE over real tokens."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ref = transformers.ElectraForPreTraining(transformers.ElectraConfig(
        vocab_size=50, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=40, hidden_act="gelu_new", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    ref.save_pretrained(tmp_path)
    ours = BertForReplacedTokenDetection.from_pretrained(tmp_path).eval()
    assert ours.mask_predictions.LayerNorm is None
    ids, mask, _ = batch()
    replaced = torch.randint(0, 2, ids.shape, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask, labels=replaced)
        got = ours(ids, mask, labels=replaced.masked_fill(mask == 0, IGNORE_INDEX))
        hidden = ours.bert(ids, mask).last_hidden_state
        head = ours.mask_predictions
        inner = F.gelu(F.linear(hidden, head.dense.weight, head.dense.bias), approximate="tanh")  # gelu_new
        formula = F.linear(inner, head.classifier.weight, head.classifier.bias).squeeze(-1)
    real = mask.bool()
    torch.testing.assert_close(got.logits[real], want.logits[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(got.logits[real], formula[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(got.loss, want.loss, rtol=0, atol=1e-5)
