"""`bertforge.training.parallel`: one process is not wrapped; FSDP without several processes is refused.
(Several processes: the torchrun tests of each trainer.)"""

from __future__ import annotations

import pytest
import torch

from bertforge.core.errors import BertforgeError
from bertforge.core.system import Runtime
from bertforge.model import BertForPreTraining
from bertforge.training.parallel import wrap_model
from tests.helpers import tiny_config

ONE_PROCESS = Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def test_one_process_is_not_wrapped():
    model = BertForPreTraining(tiny_config())
    assert wrap_model(model, ONE_PROCESS) is model


def test_fsdp_in_one_process_is_refused():
    with pytest.raises(BertforgeError, match="--fsdp needs several processes"):
        wrap_model(BertForPreTraining(tiny_config()), ONE_PROCESS, fsdp=True)
