"""DistilBERT's names: `q_lin` and friends map onto the encoder; its `classifier.` is the sequence head's output
layer or the token classifier, whichever the model has."""

from bertforge.model.families import DISTILBERT


def test_distilbert_names_map_both_ways():
    assert DISTILBERT.to_internal("distilbert.transformer.layer.2.attention.q_lin.weight") == (
        "bert.encoder.layer.2.attention.self.query.weight")
    assert DISTILBERT.to_hf("bert.encoder.layer.0.output.LayerNorm.weight") == (
        "distilbert.transformer.layer.0.output_layer_norm.weight")
    sequence_head = {"classifier.out_proj.weight", "classifier.dense.weight"}
    assert DISTILBERT.to_internal("classifier.weight", sequence_head) == "classifier.out_proj.weight"
    assert DISTILBERT.to_internal("classifier.weight", {"classifier.weight"}) == "classifier.weight"
    assert DISTILBERT.to_internal("vocab_projector.weight") is None  # tied to the word embeddings
