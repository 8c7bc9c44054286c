"""RoBERTa, XLM-RoBERTa, DistilBERT, ALBERT, ModernBERT, DeBERTa-v2, MPNet, NomicBERT, GTE, EuroBERT,
jina-embeddings-v3 and ELECTRA on the one encoder, against `transformers` itself: every task class loads a tiny random
checkpoint that `transformers` saved with the same outputs (padded batches included), saves back what the same
`transformers` class loads with no missing or unexpected keys, and runs the packed inference path."""

import logging

import pytest
import torch

import bertforge
from bertforge import BertConfig, BertforgeError
from bertforge.model.attention import pack
from bertforge.model.families import FAMILIES
from bertforge.model import BertForNextSentencePrediction, BertForPreTraining

transformers = pytest.importorskip("transformers")

TOL = 1e-5
SIZES = dict(vocab_size=99, max_position_embeddings=64)


def hf_config(model_type: str, num_labels: int = 3):
    """A tiny random config of each family, as `transformers` spells it (no dropout: outputs are compared)."""
    if model_type == "distilbert":
        return transformers.DistilBertConfig(**SIZES, dim=32, n_layers=2, n_heads=4, hidden_dim=37, dropout=0.0,
                                             attention_dropout=0.0, num_labels=num_labels)
    common = dict(**SIZES, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=num_labels)
    if model_type == "albert":  # E < H and 3 layers sharing one group
        return transformers.AlbertConfig(**common, embedding_size=16)
    if model_type == "roberta":  # roberta-base's shape of embeddings: one token type, eps 1e-5
        return transformers.RobertaConfig(**common, type_vocab_size=1, layer_norm_eps=1e-5)
    if model_type == "xlm-roberta":
        return transformers.XLMRobertaConfig(**common)
    if model_type == "deberta-v2":  # v3's parts: log buckets (8, shorter than the rows), both terms, shared keys
        return transformers.DebertaV2Config(**common, relative_attention=True, position_buckets=8,
                                            max_relative_positions=16, pos_att_type=["p2c", "c2p"],
                                            norm_rel_ebd="layer_norm", share_att_key=True,
                                            position_biased_input=False, layer_norm_eps=1e-7)
    if model_type == "modernbert":  # a window of 4 (shorter than the batch's rows), a global layer every third
        return transformers.ModernBertConfig(
            **SIZES, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
            local_attention=4, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
            num_labels=num_labels)
    if model_type == "mpnet":  # a table of 40 rows, 32 of them read by the buckets; positions after pad id 1
        return transformers.MPNetConfig(**common, relative_attention_num_buckets=40, layer_norm_eps=1e-5)
    if model_type == "nomic_bert":  # rotary θ 1,000, SwiGLU, no biases
        return transformers.NomicBertConfig(**common)
    if model_type == "gte":  # rotary θ 160,000 (its default), gated GELU, token types
        return transformers.GteConfig(**common, type_vocab_size=2, pad_token_id=0)
    if model_type == "eurobert":  # grouped-query attention (2 key/value heads for 4), θ 250,000, late pooling
        return transformers.EuroBertConfig(
            **SIZES, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=37, pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=3,
            rope_parameters={"rope_type": "default", "rope_theta": 250_000.0}, num_labels=num_labels)
    if model_type == "jina_embeddings_v3":  # XLM-R with rotary positions (θ 20,000), its padding id 1
        return transformers.JinaEmbeddingsV3Config(**common, pad_token_id=1)
    if model_type == "electra":  # E < H: embeddings projected after their norm
        return transformers.ElectraConfig(**common, embedding_size=16)
    return transformers.BertConfig(**common)


PREFIX = {"bert": "Bert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta", "distilbert": "DistilBert",
          "albert": "Albert", "modernbert": "ModernBert", "deberta-v2": "DebertaV2", "mpnet": "MPNet",
          "nomic_bert": "NomicBert", "gte": "Gte", "eurobert": "EuroBert",
          "jina_embeddings_v3": "JinaEmbeddingsV3", "electra": "Electra"}
AUTO = {
    "Model": bertforge.AutoModel,
    "ForPreTraining": bertforge.AutoModelForPreTraining,
    "ForMaskedLM": bertforge.AutoModelForMaskedLM,
    "ForSequenceClassification": bertforge.AutoModelForSequenceClassification,
    "ForTokenClassification": bertforge.AutoModelForTokenClassification,
    "ForQuestionAnswering": bertforge.AutoModelForQuestionAnswering,
    "ForMultipleChoice": bertforge.AutoModelForMultipleChoice,
}
# transformers has no RobertaForPreTraining / DistilBertForPreTraining: its AutoModelForPreTraining gives the MLM class
CASES = [(t, task) for t in FAMILIES for task in AUTO if hasattr(transformers, PREFIX[t] + task)]
OUTPUT_NAMES = {"sop_logits": "seq_relationship_logits"}


def inputs(config, seed: int = 0):
    """A padded batch: three rows of different lengths, padding with the family's pad id."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, config.vocab_size, (3, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    mask[2, 3:] = 0
    return ids.masked_fill(mask == 0, config.pad_token_id), mask


def compare(ref_out, our_out, mask, real_only: bool = False):
    """Every output within TOL; `real_only`: per-token outputs at real positions only (the rows of padding
    queries carry no meaning, and some families' `transformers` code fills them otherwise than bertforge)."""
    compared = 0
    for name in ref_out.keys():
        if name in ("hidden_states", "attentions", "loss"):
            continue
        ref, ours = ref_out[name], getattr(our_out, OUTPUT_NAMES.get(name, name))
        if name == "last_hidden_state" or (real_only and ref.shape[:2] == mask.shape):
            # padding positions carry no meaning (bertforge leaves zeros in the last hidden state)
            m = mask.reshape(*mask.shape, *[1] * (ref.dim() - 2))
            ref, ours = ref * m, ours * m
        assert ours.shape == ref.shape, name
        assert (ref - ours).abs().max().item() <= TOL, name
        compared += 1
    assert compared


@pytest.mark.parametrize("model_type,task", CASES, ids=[f"{t}-{task}" for t, task in CASES])
def test_transformers_checkpoint_loads_with_equal_outputs_and_saves_back(tmp_path, model_type, task):
    torch.manual_seed(0)
    hf_class = getattr(transformers, PREFIX[model_type] + task)
    labels = 3 if task in ("ForSequenceClassification", "ForTokenClassification") else 2  # QA, NSP, SOP: 2
    ref = hf_class(hf_config(model_type, labels)).eval()
    ref.save_pretrained(tmp_path / "hf")
    ours = AUTO[task].from_pretrained(tmp_path / "hf").eval()
    assert ours.config.model_type == model_type
    assert ours.loading_info.missing_keys == [] and ours.loading_info.unexpected_keys == []
    ids, mask = inputs(ours.config)
    if task == "ForMultipleChoice":  # one example, its three choices: [1, 3, S]
        ids, mask = ids[None], mask[None]
    # ModernBERT's windows and DeBERTa's query-and-key mask leave padding rows filled otherwise than here
    real_only = model_type in ("modernbert", "deberta-v2")
    with torch.no_grad():
        compare(ref(input_ids=ids, attention_mask=mask), ours(input_ids=ids, attention_mask=mask), mask, real_only)

    ours.save_pretrained(tmp_path / "ours")
    back, info = hf_class.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert info["missing_keys"] == set() or not info["missing_keys"], info
    assert not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert back.config.architectures == [hf_class.__name__]
    with torch.no_grad():
        compare(back.eval()(input_ids=ids, attention_mask=mask), ours(input_ids=ids, attention_mask=mask), mask,
                real_only)


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_packed_inference_equals_the_padded_batch(tmp_path, model_type):
    """The pipelines' path (sequences end to end, no padding; RoBERTa's positions after the padding offset)."""
    torch.manual_seed(0)
    hf_class = getattr(transformers, PREFIX[model_type] + "ForSequenceClassification")
    hf_class(hf_config(model_type)).save_pretrained(tmp_path)
    model = bertforge.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    ids, mask = inputs(model.config)
    rows = [row[: int(m.sum())].tolist() for row, m in zip(ids, mask)]
    batch = pack(rows)
    with torch.no_grad():
        padded = model.bert(ids, mask).last_hidden_state
        packed = model.bert.forward_packed(batch)
        logits = model.packed_logits(packed, batch)
        assert (packed - padded[mask.bool()]).abs().max() <= TOL
        assert (logits - model(ids, mask).logits).abs().max() <= TOL


@pytest.mark.parametrize("model_type", ["bert", "roberta", "albert", "distilbert", "mpnet", "nomic_bert", "gte"])
def test_pretraining_from_scratch_saves_what_transformers_loads(tmp_path, model_type):
    """A preset of each family, trained one step here, is the same model in `transformers` (its MLM head too)."""
    config = BertConfig.preset(f"{model_type}-tiny", vocab_size=99, max_position_embeddings=66)
    model = bertforge.AutoModelForPreTraining.from_config(config)
    ids, mask = inputs(config)
    labels = ids.masked_fill(torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) > 0.3, -100)
    model(ids, mask, labels=labels).loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:  # the sentence head has none: no sentence labels here
                p -= 0.1 * p.grad
    model.save_pretrained(tmp_path)
    hf_name = PREFIX[model_type] + ("ForPreTraining" if config.family.sentence_head else "ForMaskedLM")
    ref, info = getattr(transformers, hf_name).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    model.eval()
    with torch.no_grad():
        compare(ref.eval()(input_ids=ids, attention_mask=mask), model(ids, mask, sparse_mlm=False), mask)


def test_family_parts_are_what_the_family_declares():
    albert = BertConfig.preset("albert-mini", vocab_size=500)
    model = bertforge.AutoModelForMaskedLM.from_config(albert)
    assert model.bert.embeddings.word_embeddings.weight.shape == (500, 128)  # factorised: E = 128 < H = 256
    assert len(model.bert.encoder.layer) == 1 and model.bert.encoder.schedule == [0] * 4  # 4 blocks, 1 layer
    distil = bertforge.AutoModel.from_config(BertConfig.preset("distilbert-tiny", vocab_size=50))
    assert distil.pooler is None and distil.embeddings.token_type_embeddings is None
    roberta = BertConfig.preset("roberta-tiny", vocab_size=50)
    assert roberta.position_offset == 2 and roberta.type_vocab_size == 1
    bert = BertConfig.preset("tiny")
    assert bert.model_type == "bert" and bert.position_offset == 0


@pytest.mark.parametrize("model_type", ["roberta", "distilbert"])
def test_sentence_heads_a_family_lacks_are_refused(model_type):
    config = BertConfig.preset(f"{model_type}-tiny", vocab_size=50)
    for cls in (BertForPreTraining, BertForNextSentencePrediction):
        with pytest.raises(BertforgeError, match="MLM only"):
            cls(config)
    with pytest.raises(BertforgeError, match="NSP"):
        BertForNextSentencePrediction(BertConfig.preset("albert-tiny", vocab_size=50))


def test_unsupported_model_type_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 10}')
    with pytest.raises(BertforgeError) as caught:
        bertforge.AutoModel.from_pretrained(tmp_path)
    message = str(caught.value)
    assert "'gpt2'" in message and all(name in message for name in FAMILIES)
    with pytest.raises(BertforgeError, match="unknown config preset 'gpt2-tiny'"):
        BertConfig.preset("gpt2-tiny")
    with pytest.raises(BertforgeError, match="inner_group_num"):
        BertConfig.from_dict({"model_type": "albert", "inner_group_num": 2})


@pytest.mark.parametrize("model_type", ["roberta", "distilbert", "albert", "electra"])
def test_config_json_round_trips_in_the_family_spelling(tmp_path, model_type):
    ref = hf_config(model_type)
    ref.save_pretrained(tmp_path)
    config = bertforge.AutoConfig.from_pretrained(tmp_path)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (32, 2 if model_type == "distilbert" else 3, 99)
    config.save_pretrained(tmp_path / "back")
    again = transformers.AutoConfig.from_pretrained(tmp_path / "back")
    assert type(again) is type(ref)
    for key, value in ref.to_diff_dict().items():
        if key not in ("transformers_version", "architectures", "dtype", "id2label", "label2id"):
            assert getattr(again, key) == value, key


def test_auto_config_for_model_uses_the_family_defaults():
    config = bertforge.AutoConfig.for_model("albert", hidden_size=64, num_attention_heads=4, intermediate_size=128)
    assert (config.embedding_size, config.hidden_act, config.num_hidden_groups) == (128, "gelu_new", 1)
    assert bertforge.AutoConfig.for_model("distilbert").num_hidden_layers == 6


def test_a_bert_head_from_a_roberta_file_is_reported_missing(tmp_path, caplog):
    """A base-model checkpoint under a task class: the head is initialised and named, as for BERT."""
    torch.manual_seed(0)
    transformers.RobertaModel(hf_config("roberta")).save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        model = bertforge.AutoModelForSequenceClassification.from_pretrained(tmp_path)
    assert sorted(model.loading_info.missing_keys) == [
        "classifier.dense.bias", "classifier.dense.weight", "classifier.out_proj.bias", "classifier.out_proj.weight"
    ]
    assert "classifier.dense.weight" in caplog.text


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused_naming_both(tmp_path):
    """A tokenizer and a model from different checkpoints: ids past the embedding table are refused at load, by
    the tokenizer loader (a model directory) and by a pipeline handed both."""
    from bertforge.tokenizer import Tokenizer
    from tests.helpers import write_uncased_tokenizer

    write_uncased_tokenizer(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(60)])
    torch.manual_seed(0)
    bertforge.AutoModel.from_config(BertConfig.preset("roberta-tiny", vocab_size=40)).save_pretrained(tmp_path)
    with pytest.raises(BertforgeError, match="tokenizer has 65 tokens but the model's vocab_size is 40"):
        Tokenizer.from_pretrained(tmp_path)
    with pytest.raises(BertforgeError, match="65 tokens .* vocab_size is 40"):
        bertforge.pipeline("embed", model=bertforge.AutoModel.from_pretrained(tmp_path), tokenizer=_loaded(tmp_path))


def _loaded(directory):
    """The tokenizer files of `directory` without the model beside them."""
    import shutil

    from bertforge.tokenizer import Tokenizer

    alone = directory / "alone"
    alone.mkdir()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (directory / name).is_file():
            shutil.copy(directory / name, alone / name)
    return Tokenizer.from_pretrained(alone)


@pytest.mark.parametrize("model_type", ["bert", "roberta", "electra"])
def test_multiple_choice_loss_is_transformers(tmp_path, model_type):
    """The cross-entropy over each example's choices (labels [B]) is transformers' ForMultipleChoice loss, for each
    kind of choice head (the sequence head, the pooler, ELECTRA's summary)."""
    torch.manual_seed(0)
    hf_class = getattr(transformers, PREFIX[model_type] + "ForMultipleChoice")
    ref = hf_class(hf_config(model_type, 2)).eval()
    ref.save_pretrained(tmp_path / "hf")
    ours = bertforge.AutoModelForMultipleChoice.from_pretrained(tmp_path / "hf").eval()
    ids, mask = inputs(ours.config)
    ids, mask = torch.cat([ids, ids.flip(0)]).view(2, 3, -1), torch.cat([mask, mask.flip(0)]).view(2, 3, -1)
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask, labels=labels)
        got = ours(input_ids=ids, attention_mask=mask, labels=labels)
    assert got.logits.shape == (2, 3) and abs(float(expected.loss) - float(got.loss)) <= TOL


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_multiple_choice_is_declared_where_transformers_has_the_class(model_type):
    """`Family.multiple_choice` (what `finetune --task multiple-choice` refuses a family by) says whether
    `transformers` has the family's ForMultipleChoice class."""
    assert FAMILIES[model_type].multiple_choice == hasattr(transformers, PREFIX[model_type] + "ForMultipleChoice")
