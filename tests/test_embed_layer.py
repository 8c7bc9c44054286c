"""Feature extraction from a chosen layer: `pipeline("embed", layer=K)` pools
transformers' `hidden_states[K]` (0 the embedding output, N the last layer, negative from the end), on tiny random
checkpoints of each family that `transformers` saved, and runs no block above K (the command, `bertforge
embed --layer K`: tests/commands/test_embed.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertforgeError
from bertforge.tokenizer import Tokenizer
from tests.embed_layer_helpers import LAYERS, TEXTS, TOL, VOCAB, family_checkpoints, reference_embeddings
from tests.helpers import write_uncased_tokenizer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_pretrained(write_uncased_tokenizer(tmp_path_factory.mktemp("tok"), VOCAB))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """Each family's tiny checkpoint directory and the `transformers` model that saved it."""
    return family_checkpoints(tmp_path_factory)


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
