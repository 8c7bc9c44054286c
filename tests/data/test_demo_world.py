"""Tests of `bertforge.data.demo_world`: the generated demo corpus, its facts and its bundled copy."""

from __future__ import annotations

import gzip
import re

import pytest

from bertforge.data import iter_documents
from bertforge.data import demo_world as world


def test_the_bundled_corpus_is_the_generator_output(tmp_path):
    """demo_corpus.txt.gz is exactly what `write` produces (regenerate it with `python -m bertforge.data.demo_world`
    after changing a table), and reads back as the generated documents."""
    fresh = tmp_path / "demo.txt.gz"
    world.write(fresh)
    assert fresh.read_bytes() == world.DEMO_CORPUS.read_bytes()
    assert list(iter_documents(world.DEMO_CORPUS, as_documents=True)) == world.documents()


def test_same_seed_same_documents_other_seed_others():
    assert world.documents(seed=3, n=50) == world.documents(seed=3, n=50)
    assert world.documents(seed=3, n=50) != world.documents(seed=4, n=50)


def test_every_document_is_a_story_with_several_sentences():
    docs = world.documents(n=300)
    assert all(5 <= len(doc) <= 15 for doc in docs)
    for doc in docs:
        name = next(n for n in world.NAMES if n in doc[0])  # the first sentence introduces a person and an animal
        assert all(other not in " ".join(doc) for other in world.NAMES if other != name)
        assert all(s[0].isupper() and s[-1] == "." for s in doc)


def facts_told(docs) -> dict[str, set[str]]:
    """What each sentence shape says, read back from the text: {relation: {(subject, object) as 'a->b'}}."""
    found: dict[str, set[str]] = {"sound": set(), "capital": set(), "next_day": set(), "colour": set(), "sum": set()}
    for doc in docs:
        for s in doc:
            if m := re.search(r"the (\w+): it (\w+)\.$|the (\w+) (\w+)\.$", s):
                animal, sound = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
                if animal in world.ANIMALS:
                    found["sound"].add(f"{animal}->{sound}")
            if m := re.fullmatch(r"The capital of (\w+) is (\w+)\.", s):
                found["capital"].add(f"{m.group(1)}->{m.group(2)}")
            if m := re.fullmatch(r"After (\w+day) comes (\w+)\.", s):
                found["next_day"].add(f"{m.group(1)}->{m.group(2)}")
            if m := re.fullmatch(r"The colour of (.+) is (\w+)\.", s):
                found["colour"].add(f"{m.group(1)}->{m.group(2)}")
            if m := re.fullmatch(r"(\w+) and (\w+) make (\w+)\.", s):
                a, b, c = (world.NUMBERS.index(w.lower()) for w in m.groups())
                found["sum"].add(f"{a}+{b}->{c}")
    return found


def test_the_facts_never_change_and_each_is_told():
    """Every fact is told the same way each time (the world is consistent: what fills a blank depends on its
    sentence only), and every fact of the tables appears in the corpus."""
    found = facts_told(world.documents())
    assert found["sound"] == {f"{a}->{v[0]}" for a, v in world.ANIMALS.items()}
    assert found["capital"] == {f"{c}->{city}" for c, city in world.CAPITALS.items()}
    assert found["next_day"] == {f"{d}->{world.DAYS[(i + 1) % 7]}" for i, d in enumerate(world.DAYS)}
    assert found["colour"] == {f"{t}->{c}" for t, c in world.COLOURS.items()}
    assert all(int(s.split("->")[1]) == sum(map(int, s.split("->")[0].split("+"))) for s in found["sum"])


def test_articles_and_capitals():
    assert world.article("owl") == "an owl" and world.article("dog") == "a dog"
    assert world.capital("the sky is blue.") == "The sky is blue."


def test_write_is_gzip_text_with_blank_lines_between_documents(tmp_path):
    out = tmp_path / "w.txt.gz"
    world.write(out, seed=1, n=3)
    text = gzip.decompress(out.read_bytes()).decode("utf-8")
    assert text.count("\n\n") == 2 and text.endswith(".\n")
    assert [p.split("\n") for p in text.strip().split("\n\n")] == world.documents(seed=1, n=3)


def test_command_line(tmp_path, monkeypatch):
    out = tmp_path / "c.txt.gz"
    monkeypatch.setattr("sys.argv", ["demo_world", str(out)])
    world.main()
    assert out.read_bytes() == world.DEMO_CORPUS.read_bytes()
    monkeypatch.setattr("sys.argv", ["demo_world"])
    with pytest.raises(SystemExit, match="usage"):
        world.main()


def test_each_probe_is_told_and_its_blank_has_one_filler():
    """Every probe with its answer filled in is a sentence of the corpus, and wherever the corpus has the probe's
    sentence with any word in the blank, that word is the answer: the blank is decided by its context."""
    sentences = [s for doc in world.documents() for s in doc]
    told = set(sentences)
    for text, answer in world.PROBES:
        assert text.count("[MASK]") == 1 and " " not in answer
        assert text.replace("[MASK]", answer) in told, text
        before, after = text.split("[MASK]")
        fillers = {s[len(before):len(s) - len(after)] for s in sentences
                   if s.startswith(before) and s.endswith(after) and " " not in s[len(before):len(s) - len(after)]}
        assert fillers == {answer}, (text, fillers)


def test_probes_want_different_words():
    """A model that answers every probe the same way (the corpus's commonest word) gets at most one right."""
    answers = [answer for _, answer in world.PROBES]
    assert len(set(answers)) == len(answers) >= 10
