"""Training sentence-embedding models (`bertforge train-embeddings`): pairs, triplets, scored pairs or scored
triplets in; a sentence-transformers model directory out (a SparseEncoder for SPLADE, `sparse="splade"`).

    from bertforge.embeddings_train import train_embeddings
    train_embeddings(model="all-MiniLM-L6-v2/", train="pairs.tsv", dev="dev.tsv", out="tuned/",
                     batch_size=256, mini_batch_size=32)

Modules: `config` (the settings, which are the command's options), `data` (file readers and shape detection),
`losses` (MNRL, CoSENT, cosine MSE, Matryoshka, margin-MSE, SPLADE's FLOPS regularizers), `encoder` (texts →
embeddings through the packed encoder, dense or SPLADE),
`trainer` (the loop on fine-tuning's, gradient caching), `evaluation` (retrieval metrics, Spearman), `api`.
"""

from .api import train_embeddings
from .config import EmbeddingsConfig

__all__ = ["EmbeddingsConfig", "train_embeddings"]
