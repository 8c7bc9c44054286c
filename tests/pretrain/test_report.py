"""`bertforge.pretrain.report`: the summary line of a run's MLM loss and accuracy, and the demo's [MASK]
predictions (moved here from tests/pretrain/test_trainer.py)."""

import torch

from bertforge.pretrain.report import metrics_summary, show_predictions


def test_metrics_summary_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert metrics_summary(path, 100) is None  # no file
    path.write_text('{"step": 10, "mlm_loss": 4.5, "mlm_accuracy": 0.01}\n')
    assert metrics_summary(path, 100) is None  # one row: nothing to compare
    path.write_text('{"step": 10, "mlm_loss": 4.5, "mlm_accuracy": 0.01}\n{"step": 90, "mlm_loss": 2.25, "mlm_accuracy": 0.3}\n')
    assert metrics_summary(path, 100) == (
        "MLM loss 4.50 (step 10) -> 2.25 (step 90); ln(vocab) = 4.61 is a uniform guess; MLM accuracy 1.0% -> 30.0%"
    )


def test_demo_predictions_mark_and_count_the_probes_answered_as_the_corpus_tells(tmp_path, caplog):
    """`show_predictions` asks every probe of `demo_world.PROBES`; a top guess that is the probe's answer is marked
    with + and counted. A model that knows the answers of the first five probes (their [MASK] logits point at the
    answer; every other row points at "the") scores 5, whatever its other guesses."""
    import logging
    from types import SimpleNamespace

    from bertforge.data.demo_world import PROBES
    from bertforge.tokenizer import Tokenizer
    from tests.helpers import SPECIALS, write_uncased_tokenizer

    words = sorted({w.strip(".,").lower() for text, answer in PROBES for w in [*text.split(), answer]} - {"[mask]"})
    tok = Tokenizer.from_pretrained(write_uncased_tokenizer(tmp_path / "tok", [*SPECIALS, ".", ",", *words]))
    known = {tuple(tok(text.replace("[MASK]", tok.mask_token))["input_ids"]): answer for text, answer in PROBES[:5]}

    class Knows(torch.nn.Module):
        def forward(self, input_ids, token_type_ids):
            logits = torch.zeros(*input_ids.shape, tok.vocab_size)
            logits[..., tok.convert_tokens_to_ids("the")] = 1.0
            answer = known.get(tuple(input_ids[0].tolist()))
            if answer is not None:
                logits[0, input_ids[0] == tok.mask_token_id, tok.convert_tokens_to_ids(answer.lower())] = 5.0
            return SimpleNamespace(prediction_logits=logits)

    with caplog.at_level(logging.INFO, logger="bertforge"):
        right = show_predictions(Knows(), tok, "after training", torch.device("cpu"))
    assert right == 5
    text = caplog.text
    assert f"(+: the word the demo corpus puts there; 5 of {len(PROBES)})" in text
    marked = [line for line in text.splitlines() if line.startswith("  + ")]
    assert [line.split("->")[0].strip(" +") for line in marked] == [t for t, _ in PROBES[:5]]
    assert all(line.split("->")[1].split()[0] == answer.lower() for line, (_, answer) in zip(marked, PROBES))
    assert show_predictions(Knows(), tok, "again", torch.device("cpu"), emit=False) == 5


def test_the_demo_reads_the_logits_its_objective_names(tmp_path):
    """`logits`: the objective's reading of the output (a distilled student's output is a MaskedLMOutput)."""
    from types import SimpleNamespace

    from bertforge.data.demo_world import PROBES
    from bertforge.tokenizer import Tokenizer
    from tests.helpers import SPECIALS, write_uncased_tokenizer

    words = sorted({w.strip(".,").lower() for text, answer in PROBES for w in [*text.split(), answer]} - {"[mask]"})
    tok = Tokenizer.from_pretrained(write_uncased_tokenizer(tmp_path / "tok", [*SPECIALS, ".", ",", *words]))

    class Answers(torch.nn.Module):
        def forward(self, input_ids, token_type_ids):
            logits = torch.zeros(*input_ids.shape, tok.vocab_size)
            logits[..., tok.convert_tokens_to_ids(PROBES[0][1].lower())] = 1.0
            return SimpleNamespace(logits=logits)  # no prediction_logits

    right = show_predictions(Answers(), tok, "t", torch.device("cpu"), emit=False, logits=lambda out: out.logits)
    assert right == sum(answer.lower() == PROBES[0][1].lower() for _, answer in PROBES)


def test_the_predictions_are_text_not_byte_level_pieces(tmp_path, caplog):
    """Issue 46: with a byte-level BPE tokenizer the guesses printed as the vocabulary's pieces ("Ġdog")."""
    import logging
    from types import SimpleNamespace

    from bertforge.data.demo_world import PROBES
    from bertforge.tokenizer import Tokenizer

    texts = [text.replace("[MASK]", answer) for text, answer in PROBES] * 20
    tok = Tokenizer.train(iter(texts), vocab_size=400, kind="roberta", min_frequency=1, show_progress=False)
    word = tok.convert_tokens_to_ids("Ġdog")
    assert isinstance(word, int)

    class Guesses(torch.nn.Module):
        def forward(self, input_ids, token_type_ids):
            logits = torch.zeros(*input_ids.shape, tok.vocab_size)
            logits[..., word] = 5.0
            return SimpleNamespace(prediction_logits=logits)

    with caplog.at_level(logging.INFO, logger="bertforge"):
        show_predictions(Guesses(), tok, "t", torch.device("cpu"))
    guesses = [line.split("->")[1] for line in caplog.text.splitlines() if "->" in line]
    assert guesses and all(g.split()[0] == "dog" for g in guesses) and "Ġ" not in caplog.text
