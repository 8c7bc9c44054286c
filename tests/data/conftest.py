"""Fixtures of the data tests."""

import pytest
from tests.data.data_helpers import WordVocab, tagged_docs, write_txt


@pytest.fixture
def tagged_corpus(tmp_path):
    """40 tagged documents in one text file: (its path, the documents, their `WordVocab`)."""
    docs = tagged_docs(40, seed=1)
    return write_txt(tmp_path / "corpus.txt", docs), docs, WordVocab(docs)
