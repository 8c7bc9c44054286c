"""Evaluating embedding models and rerankers on local files: scored pairs (STS), BEIR retrieval folders and
reranking rows, with the numbers sentence-transformers' evaluators give.

Modules: `metrics` (the definitions: correlations, retrieval and reranking metrics), `topk` (exact top-k over a
corpus streamed in blocks), `data` (the file readers), `evaluators` (a model, as functions, scored on a set),
`negatives` (hard-negative mining, as sentence-transformers' `mine_hard_negatives`).
`bertforge evaluate --task sts|retrieval|rerank` runs them through the pipelines; `train-embeddings --dev` through
its own encoder; `bertforge mine-negatives` mines through the pipelines.
"""
