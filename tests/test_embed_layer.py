"""Feature extraction from a chosen layer: `pipeline("embed", layer=K)` and `bertforge embed --layer K` pool
transformers' `hidden_states[K]` (0 the embedding output, N the last layer, negative from the end), on tiny random
checkpoints of each family that `transformers` saved, and run no block above K."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertforgeError
from bertforge.cli import main
from bertforge.tokenizer import Tokenizer
from tests.helpers import SPECIALS, WORDS, write_uncased_tokenizer

transformers = pytest.importorskip("transformers")

TOL = 1e-5
VOCAB = SPECIALS + WORDS + ["##s", "##ed", "the", "a", "of"]
TEXTS = ["the river stone", "a quiet morning of golden light walked the forest", "ship", "",
         "the ancient castle opened a heavy window", "silver songs"]
LAYERS = 3


def hf_model(model_type: str):
    """A tiny random `transformers` base model of the family (no dropout), pad id 0 as the test tokenizer's."""
    common = dict(vocab_size=len(VOCAB), max_position_embeddings=64, pad_token_id=0)
    if model_type == "distilbert":
        config = transformers.DistilBertConfig(**common, dim=32, n_layers=LAYERS, n_heads=4, hidden_dim=37,
                                               dropout=0.0, attention_dropout=0.0)
        return transformers.DistilBertModel(config)
    sizes = dict(**common, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=4, intermediate_size=37,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if model_type == "albert":  # E < H, the three blocks sharing one layer
        return transformers.AlbertModel(transformers.AlbertConfig(**sizes, embedding_size=16))
    if model_type == "roberta":  # positions counted after the padding id
        return transformers.RobertaModel(transformers.RobertaConfig(**sizes, type_vocab_size=1))
    return transformers.BertModel(transformers.BertConfig(**sizes))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_pretrained(write_uncased_tokenizer(tmp_path_factory.mktemp("tok"), VOCAB))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """Each family's tiny checkpoint directory and the `transformers` model that saved it."""
    found = {}
    for model_type in ("bert", "roberta", "albert", "distilbert"):
        torch.manual_seed(0)
        reference = hf_model(model_type).eval()
        directory = tmp_path_factory.mktemp(model_type)
        reference.save_pretrained(directory)
        found[model_type] = (directory, reference)
    return found


def reference_embeddings(reference, rows: list[list[int]], layer: int) -> np.ndarray:
    """transformers' `hidden_states[layer]` of the padded batch, mean-pooled over the attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
    with torch.no_grad():
        hidden = reference(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[layer]
    summed = (hidden * mask[..., None]).sum(1)
    return (summed / mask.sum(1, keepdim=True)).numpy()


@pytest.mark.parametrize("model_type", ["bert", "roberta", "albert", "distilbert"])
def test_each_layer_equals_transformers_hidden_states(checkpoints, tokenizer, model_type):
    directory, reference = checkpoints[model_type]
    model = bertforge.AutoModel.from_pretrained(directory)
    default = bertforge.pipeline("embed", model=model, tokenizer=tokenizer, pooling="mean", normalize=False)
    rows = [f.input_ids for f in default.features(TEXTS)[0]]
    assert 0 not in [t for r in rows for t in r]  # no padding id inside a text (RoBERTa's positions)
    for layer in range(LAYERS + 1):
        pipe = bertforge.pipeline("embed", model=model, tokenizer=tokenizer, pooling="mean", normalize=False,
                                  layer=layer)
        ours = pipe(TEXTS)
        theirs = reference_embeddings(reference, rows, layer)
        assert np.abs(ours - theirs).max() <= TOL, (model_type, layer)
        below = bertforge.pipeline("embed", model=model, tokenizer=tokenizer, pooling="mean", normalize=False,
                                   layer=layer - LAYERS - 1)  # the same layer counted from the end
        assert np.array_equal(below(TEXTS), ours)
    assert np.array_equal(default(TEXTS), ours)  # the default is the last layer: -1 = N
    layers_apart = np.abs(reference_embeddings(reference, rows, 1) - reference_embeddings(reference, rows, 2)).max()
    assert layers_apart > 1e-2  # the layers differ, so the comparison above tells them apart


def test_cls_pooling_and_normalize_apply_to_the_chosen_layer(checkpoints, tokenizer):
    directory, reference = checkpoints["bert"]
    model = bertforge.AutoModel.from_pretrained(directory)
    pipe = bertforge.pipeline("embed", model=model, tokenizer=tokenizer, pooling="cls", normalize=True, layer=1)
    rows = [f.input_ids for f in pipe.features(TEXTS)[0]]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        first = reference(input_ids=ids, attention_mask=(ids != 0).long(), output_hidden_states=True).hidden_states[1][:, 0]
    expected = torch.nn.functional.normalize(first, dim=-1).numpy()
    assert np.abs(pipe(TEXTS) - expected).max() <= TOL


def test_blocks_above_the_layer_are_not_run(checkpoints, tokenizer):
    directory, _ = checkpoints["bert"]
    model = bertforge.AutoModel.from_pretrained(directory)
    runs = [0] * LAYERS
    for i, block in enumerate(model.encoder.layer):
        block.register_forward_hook(lambda module, args, out, i=i: runs.__setitem__(i, runs[i] + 1))
    bertforge.pipeline("embed", model=model, tokenizer=tokenizer, layer=1)(TEXTS)
    assert runs[0] > 0 and runs[1:] == [0] * (LAYERS - 1)
    bertforge.pipeline("embed", model=model, tokenizer=tokenizer, layer=0)(TEXTS)
    assert runs[1:] == [0] * (LAYERS - 1)  # layer 0: the embeddings alone


@pytest.mark.parametrize("layer", [LAYERS + 1, -(LAYERS + 2), 1.0, "2", True])
def test_a_layer_out_of_range_is_refused_naming_the_range(checkpoints, tokenizer, layer):
    model = bertforge.AutoModel.from_pretrained(checkpoints["bert"][0])
    with pytest.raises(BertforgeError, match=rf"layer must be an integer in -4\.\.3 for this 3-layer model .*got {layer!r}"):
        bertforge.pipeline("embed", model=model, tokenizer=tokenizer, layer=layer)


def test_cli_embed_layer(tmp_path, checkpoints, capsys):
    directory, reference = checkpoints["bert"]
    model_dir = tmp_path / "model"
    reference.save_pretrained(model_dir)
    write_uncased_tokenizer(model_dir, VOCAB)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "layer1.npy"
    assert main(["embed", "--model", str(model_dir), "--input", str(texts), "--output", str(out), "--layer", "1",
                 "--no-normalize", "--pooling", "mean"]) == 0
    assert "mean pooling of layer 1" in capsys.readouterr().err
    rows = [f.input_ids for f in bertforge.pipeline("embed", model=model_dir).features(TEXTS)[0]]
    assert np.abs(np.load(out) - reference_embeddings(reference, rows, 1)).max() <= TOL
    assert main(["embed", "--model", str(model_dir), "--input", str(texts), "--output", str(tmp_path / "no.npy"),
                 "--layer", "-5"]) == 2
    assert "layer must be an integer in -4..3" in capsys.readouterr().err
    assert not (tmp_path / "no.npy").exists()
