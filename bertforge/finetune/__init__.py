"""Fine-tuning and evaluation: sentence(-pair) classification and regression, NER, extractive QA.

    from bertforge.finetune import finetune, evaluate, predict

    finetune(task="classification", model="minilm/", train="train.tsv", dev="dev.tsv", out="runs/sst2", epochs=1)
    evaluate("classification", "runs/sst2/model", "test.tsv")        # {"accuracy": ..., "f1": ..., ...}
    predict("classification", "runs/sst2/model", "new.tsv", "predictions.jsonl")

The same as `bertforge finetune|evaluate|predict` on the command line.
"""

from .api import evaluate, finetune, load_finetuned, predict
from .config import FINETUNE_TASKS, DataOptions, FinetuneConfig

__all__ = ["FINETUNE_TASKS", "DataOptions", "FinetuneConfig", "evaluate", "finetune", "load_finetuned", "predict"]
