"""`bertforge serve --quantize int8` (`bertforge.commands.serve`): the served model is quantised, once."""

from __future__ import annotations

import pytest

from bertforge.core.linear import int8_available
from bertforge.model.quantize import is_quantized

# int8_models (tests/model/test_quantize.py's tiny models): a fixture of tests/commands/conftest.py

pytestmark = pytest.mark.skipif(not int8_available(), reason="this PyTorch has no dynamic int8 linear kernels")


def test_serve_quantize(int8_models):
    pytest.importorskip("starlette")
    from bertforge.commands.serve import add_arguments
    from bertforge.serve import Engine, ServeConfig
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--model", str(int8_models["classify"]), "--quantize", "int8"])
    engine = Engine(ServeConfig(model=args.model, quantize=args.quantize))
    try:
        assert all(is_quantized(p.model) for p in engine.pipelines.values())
        assert len({id(p.model) for p in engine.pipelines.values()}) == 1  # one copy of the weights, quantised once
    finally:
        engine.stop()  # its batcher thread, which loaded the model
    ServeConfig.from_json(ServeConfig(model="m", quantize="int8").to_json())
