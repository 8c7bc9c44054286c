"""The one training step, the one loop, the metrics log, the one checkpoint, optimizers and schedules, the run directory and a run's wall-time budget."""
