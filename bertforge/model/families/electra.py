"""ELECTRA (Clark et al., 2020, "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than Generators"):
BERT's post-LN encoder with embeddings of width E projected to H after their norm (`embeddings_project`, with a
bias, where E != H), no pooler, a first-token sequence head with GELU (dropout → dense → GELU → dropout →
out_proj), an MLM head (the generator's: dense H → E → GELU → LayerNorm → the tied decoder) and the discriminator's
replaced-token head (`ElectraForPreTraining`: dense → the hidden activation → one logit per token, no norm).

Presets `electra-SIZE`: small is ELECTRA-Small of the paper's pretraining hyperparameters (its appendix, Table 6:
12 layers, H 256, 4 heads, I 1024, E 128), base and large ELECTRA-Base and -Large (E = H); tiny, mini and medium are
the generic sizes with E = H / 2.

Its pretraining recipe is the paper's replaced-token detection (`bertforge.model.rtd`, the objective shared with
DeBERTa-v3): 15 % of the tokens masked, the discriminator's loss weighted by 50, and a generator as deep as the
discriminator at a quarter of its hidden size, feed-forward width and heads (Table 6's generator size: 1/4 for
Small and Large, 1/3 for Base; ELECTRA-Small's generator is H 64, one head, I 256), sharing its token and position
embeddings with the discriminator (section 3.2: "we only share the embeddings (both the token and positional
embeddings)"). The run's OUT/model is the discriminator (`ElectraForPreTraining`), OUT/generator the generator
(`ElectraForMaskedLM`). The tokenizer is BERT's WordPiece.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .family import BertParts, Family, Generator, Recipe

if TYPE_CHECKING:
    from ..config import BertConfig


def embedding_width(hidden: int) -> dict[str, int]:
    """A preset's E: ELECTRA-Small's H / 2 (128 at H 256) below base size; E = H from base up (the paper's)."""
    return {"embedding_size": hidden // 2 if hidden < 768 else hidden}


def write_config(out: dict[str, Any], config: BertConfig) -> dict[str, Any]:
    """config.json with `embedding_size` always written (`transformers.ElectraConfig` defaults it to 128)."""
    if config.embedding_size is None:
        out["embedding_size"] = config.hidden_size
    return out


ELECTRA = Family(
    model_type="electra",
    name="ELECTRA",
    class_prefix="Electra",
    prefix="electra",
    body=("embeddings", "embeddings_project", "encoder"),
    parts=BertParts(pooler=False, sequence_head="first-token", sequence_act="gelu", mlm_act="gelu",
                    rtd_context=False, choice_head="summary"),
    sentence_head=None,
    defaults=dict(  # `transformers.ElectraConfig`'s (electra-small-discriminator's sizes)
        vocab_size=30522, embedding_size=128, hidden_size=256, num_hidden_layers=12, num_attention_heads=4,
        intermediate_size=1024, hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        max_position_embeddings=512, type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=0,
    ),
    unused=("num_hidden_groups",),
    write_config=write_config,
    keys=(
        ("bert.embeddings_project.", "bert.encoder.embedding_projection."),
        ("generator_predictions.dense.", "cls.predictions.transform.dense."),
        ("generator_predictions.LayerNorm.", "cls.predictions.transform.LayerNorm."),
        ("generator_lm_head.bias", "cls.predictions.bias"),
        ("discriminator_predictions.dense_prediction.", "mask_predictions.classifier."),
        ("discriminator_predictions.dense.", "mask_predictions.dense."),
        ("sequence_summary.summary.", "summary."),  # ElectraForMultipleChoice's head
    ),
    dropped=(r"^generator_lm_head\.weight$",),  # tied to the word embeddings
    class_names={"BertForReplacedTokenDetection": "ElectraForPreTraining"},
    sizes=dict(small=(12, 256, 4, 1024), base=(12, 768, 12, 3072), large=(24, 1024, 16, 4096)),
    sized_preset=embedding_width,
    recipe=Recipe(objective="rtd", generator=Generator(depth=1.0, width=0.25, sharing="tied")),
    objectives=("rtd",),
    tokenizer="bert",
)

__all__ = ["ELECTRA", "embedding_width", "write_config"]
