"""Pretraining: its settings, its model and tokenizer, its data, its objectives (MLM, NSP/SOP, distillation), its held-out evaluation, its report and the `Pretrainer`."""
