"""`bertforge export-onnx`: an ONNX file with dynamic batch and sequence axes, checked against onnxruntime."""

from __future__ import annotations

import argparse
import sys

from . import add_quantize_argument

NAME = "export-onnx"
HELP = "export a model to ONNX (dynamic batch and sequence axes) and check it against onnxruntime"
EXAMPLES = (
    'bertforge export-onnx --model runs/sst2/model --out sst2.onnx --quantize int8',
)  # `--help` shows them; tests/test_cli.py parses them


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory")
    parser.add_argument("--out", required=True, metavar="FILE", help="the .onnx file to write")
    parser.add_argument("--model-class", default="auto", metavar="CLASS",
                        help="auto (the class config.json names, if its head weights are there), none (BertModel), "
                        "or a class name such as BertForSequenceClassification")
    parser.add_argument("--opset", type=int, default=17, metavar="N", help="ONNX opset (17)")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="skip comparing onnxruntime with PyTorch on inputs of several shapes")
    add_quantize_argument(parser, "the exported graph (onnxruntime's dynamic quantisation of the float32 export)")


def run(args: argparse.Namespace) -> int:
    from ..model.onnx import export_onnx

    report = export_onnx(args.model, args.out, model_class=args.model_class, opset=args.opset, check=args.check,
                         quantize=args.quantize)
    checked = (
        f"onnxruntime agrees on {len(report.shapes)} shapes "
        f"({', '.join(f'{b}x{s}' for b, s in report.shapes)}; max relative difference {report.max_diff:.1e})"
        if args.check else "not checked"
    )
    if args.quantize:
        checked += f"; int8: max relative difference to float32 PyTorch {report.int8_diff:.1e}" if args.check else ""
    print(f"{report.model_class} -> {report.path}{' (int8)' if args.quantize else ''} (outputs: {', '.join(report.outputs)}); {checked}", file=sys.stderr)
    return 0
