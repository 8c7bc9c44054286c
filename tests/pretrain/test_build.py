"""`bertforge.pretrain.build`: the run's model config (the tokenizer's vocabulary), the weights it starts from,
and the tokenizer it chooses."""

from __future__ import annotations

import torch

from bertforge.model import BertForPreTraining
from bertforge.model.config import BertConfig
from bertforge.pretrain.build import choose_tokenizer, initial_model, run_model_config
from bertforge.core.system import Runtime
from tests.helpers import tiny_config, tiny_run_args

ONE_PROCESS = Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def test_the_run_config_takes_the_tokenizers_vocabulary(corpus_and_tokenizer, tmp_path):
    from bertforge.tokenizer import Tokenizer

    args = tiny_run_args(corpus_and_tokenizer, tmp_path / "run")
    tokenizer, trained = choose_tokenizer(args, tmp_path / "run", [str(corpus_and_tokenizer[0])], ONE_PROCESS)
    assert not trained and isinstance(tokenizer, Tokenizer)  # --tokenizer given: none trained
    base = tiny_config(vocab_size=999)
    config = run_model_config(base, tokenizer, args)
    assert config.vocab_size == tokenizer.vocab_size and config.pad_token_id == tokenizer.pad_token_id
    assert run_model_config(base, None, args).vocab_size == args.vocab_size  # rank > 0 before rank 0 trained one


def test_initial_weights_come_from_the_seed(corpus_and_tokenizer, tmp_path):
    args = tiny_run_args(corpus_and_tokenizer, tmp_path / "run", seed=3)
    config = tiny_config()
    first, again = initial_model(config, args, False, True), initial_model(config, args, False, True)
    assert isinstance(first, BertForPreTraining)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))


def test_a_modernbert_run_config_names_the_tokenizers_special_ids(corpus_and_tokenizer, tmp_path):
    """ModernBERT's config.json carries bos/eos/cls/sep ids: a run's are its tokenizer's ([CLS] begins a sequence,
    [SEP] ends it, as in transformers' ModernBERT configs), not None; BERT's config has no such fields."""
    from bertforge.tokenizer import Tokenizer

    args = tiny_run_args(corpus_and_tokenizer, tmp_path / "run")
    tokenizer = Tokenizer.from_pretrained(str(corpus_and_tokenizer[1]))
    config = run_model_config(BertConfig.preset("modernbert-tiny"), tokenizer, args)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    assert {k: config.extra[k] for k in ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")} == dict(
        bos_token_id=cls, eos_token_id=sep, cls_token_id=cls, sep_token_id=sep)
    assert "cls_token_id" not in run_model_config(tiny_config(), tokenizer, args).extra
