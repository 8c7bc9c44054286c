"""Feature extraction from a chosen layer: the tiny random checkpoints of each family that `transformers` saved and
transformers' own pooled `hidden_states[K]`, shared by the pipeline's tests (`tests/test_embed_layer.py`) and the
command's (`bertforge embed --layer`, `tests/commands/test_embed.py`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tests.helpers import SPECIALS, WORDS

TOL = 1e-5
VOCAB = SPECIALS + WORDS + ["##s", "##ed", "the", "a", "of"]
TEXTS = ["the river stone", "a quiet morning of golden light walked the forest", "ship", "",
         "the ancient castle opened a heavy window", "silver songs"]
LAYERS = 3
FAMILIES = ("bert", "roberta", "albert", "distilbert")


def hf_model(model_type: str):
    """A tiny random `transformers` base model of the family (no dropout), pad id 0 as the test tokenizer's."""
    import transformers

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


def family_checkpoints(tmp_path_factory, families=FAMILIES) -> dict[str, tuple[Path, torch.nn.Module]]:
    """Each family's tiny checkpoint directory and the `transformers` model that saved it."""
    found = {}
    for model_type in families:
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
