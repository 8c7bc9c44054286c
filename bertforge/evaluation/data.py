"""The files `bertforge evaluate` scores embedding models and rerankers on.

* Scored pairs (`--task sts`): sentence1, sentence2, score; CSV (with a header, or three columns without one),
  TSV, JSONL, Parquet or Arrow, read by `train-embeddings`' reader (`embeddings_train.data.read_pairs`).
* A BEIR folder (`--task retrieval`): `corpus.jsonl` (`_id`, `title`, `text`), `queries.jsonl` (`_id`, `text`) and
  `qrels/test.tsv` (a header, then query-id, corpus-id, score; another qrels file by `qrels=`). A document's text is
  its title and text joined by a space, as BEIR's own dense retrievers join them. A qrels score above 0 is relevant
  (BEIR's and MTEB's rule); a query counts when it has a relevant document, as in sentence-transformers' evaluator.
  Ids are strings.
* Reranking rows (`--task rerank`): any layout `finetune --task rerank` reads (`finetune.rerank`): query,
  positives, negatives (three columns of any names, by position; a cell one text or a list of texts, maybe empty),
  mined n-tuples, pointwise or listwise rows with labels (relevant: a label of at least 0.5). Rows of the same
  query are one query: its documents gathered, each text once, the relevant ones first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import BertforgeError
from ..data.tables import is_path
from ..finetune.data import read_text_file

if TYPE_CHECKING:  # embeddings_train's dev evaluation imports this module: its reader is imported when called
    from ..embeddings_train.data import PairData


def read_scored_pairs(data: Any) -> PairData:
    """Scored pairs from a file (or rows in memory); anything but two texts and a score is refused."""
    from ..embeddings_train.data import read_pairs

    pairs = read_pairs(data)
    if pairs.shape != "scored":
        raise BertforgeError(f"{pairs.path}: --task sts needs scored pairs (sentence1, sentence2, score); this file "
                             f"holds {pairs.shape}")
    return pairs


@dataclass(frozen=True)
class RetrievalData:
    """A retrieval benchmark: the corpus in ascending id order, the queries that have a relevant document, and
    each one's relevant ids."""

    corpus_ids: list[str]
    corpus: list[str]
    query_ids: list[str]
    queries: list[str]
    relevant: list[set[str]]


def _jsonl(path: Path, keys: tuple[str, ...]) -> list[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise BertforgeError(f"{path}: no such file (a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/)")
    rows = []
    for number, line in enumerate(read_text_file(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise BertforgeError(f"{path}:{number}: not a JSON object ({err.msg})") from None
        if not isinstance(row, dict) or "_id" not in row:
            raise BertforgeError(f"{path}:{number}: expected a JSON object with {', '.join(keys)}")
        for key in keys[1:]:
            if key in row and row[key] is not None and not isinstance(row[key], str):
                raise BertforgeError(f"{path}:{number}: {key} is not a text ({row[key]!r:.40})")
        rows.append((number, row))
    if not rows:
        raise BertforgeError(f"{path}: no rows")
    return rows


def _qrels(path: Path) -> dict[str, set[str]]:
    if not path.is_file():
        raise BertforgeError(f"{path}: no such qrels file (give one with --qrels)")
    relevant: dict[str, set[str]] = {}
    lines = read_text_file(path).splitlines()
    for number, line in enumerate(lines, start=1):
        cells = line.rstrip("\r").split("\t")
        if not line.strip() or (number == 1 and cells[-1].strip().lower() == "score"):
            continue  # the header: query-id, corpus-id, score
        if len(cells) != 3:
            raise BertforgeError(f"{path}:{number}: expected 3 tab-separated fields (query-id, corpus-id, score), "
                                 f"got {len(cells)}")
        try:
            score = float(cells[2])
        except ValueError:
            raise BertforgeError(f"{path}:{number}: the score {cells[2]!r} is not a number") from None
        if score > 0:
            relevant.setdefault(cells[0].strip(), set()).add(cells[1].strip())
    return relevant


def read_beir(folder: str | Path, qrels: str | Path | None = None) -> RetrievalData:
    """A BEIR folder's corpus, queries and relevance judgements (see the module docstring)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BertforgeError(f"{folder}: not a directory (--task retrieval takes a BEIR folder: corpus.jsonl, "
                             "queries.jsonl, qrels/test.tsv)")
    documents: dict[str, str] = {}
    for number, row in _jsonl(folder / "corpus.jsonl", ("_id", "title", "text")):
        text = f"{row.get('title') or ''} {row.get('text') or ''}".strip()
        if not text:
            raise BertforgeError(f"{folder / 'corpus.jsonl'}:{number}: document {row['_id']!r} has no title or text")
        documents[str(row["_id"])] = text
    queries = {str(row["_id"]): row.get("text") or "" for _, row in _jsonl(folder / "queries.jsonl", ("_id", "text"))}
    relevant = _qrels(Path(qrels) if qrels is not None else folder / "qrels" / "test.tsv")
    query_ids = [q for q in queries if relevant.get(q)]
    if not query_ids:
        raise BertforgeError(f"{folder}: no query of queries.jsonl has a relevant document in the qrels")
    corpus_ids = sorted(documents)
    return RetrievalData(corpus_ids, [documents[c] for c in corpus_ids], query_ids, [queries[q] for q in query_ids],
                         [relevant[q] for q in query_ids])


@dataclass(frozen=True)
class RerankData:
    """Each query with its candidates (positives first) and which of them are relevant."""

    queries: list[str]
    candidates: list[list[str]]
    relevant: list[list[bool]]


def read_rerank(data: Any) -> RerankData:
    """Reranking rows from a file or rows in memory (see the module docstring): the rows of a query gathered,
    its relevant documents first."""
    from ..finetune.config import DataOptions
    from ..finetune.rerank import RELEVANT_AT, by_query, read_rerank_rows

    rows = read_rerank_rows(data, DataOptions(), labelled=True)
    where = data if is_path(data) else "the rows"
    queries: list[str] = []
    candidates: list[list[str]] = []
    relevant: list[list[bool]] = []
    for positions in by_query(rows):
        query = rows[positions[0][0]].query
        flags = [(rows[r].labels or [])[d] >= RELEVANT_AT for r, d in positions]
        if not any(flags):
            raise BertforgeError(f"{where}: query {query!r:.60} has no positive")
        order = sorted(range(len(positions)), key=lambda i: not flags[i])  # relevant first, each side in file order
        queries.append(query)
        candidates.append([rows[positions[i][0]].documents[positions[i][1]] for i in order])
        relevant.append([flags[i] for i in order])
    return RerankData(queries, candidates, relevant)
