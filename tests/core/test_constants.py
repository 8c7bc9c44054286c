"""Each shared constant is defined once (`bertforge.core.constants`, or the one module it belongs to), under one name."""

import io
import tokenize
from pathlib import Path

import bertforge
from bertforge.core import constants
def test_ignore_index_is_one_constant_under_one_name():
    import bertforge.data
    import bertforge.data.instances
    from bertforge.data.masking import IGNORE_INDEX as masking_ignore
    from bertforge.finetune.features import IGNORE_INDEX as features_ignore
    from bertforge.model import IGNORE_INDEX as model_ignore

    assert constants.IGNORE_INDEX == -100
    for value in (masking_ignore, features_ignore, model_ignore):  # the modules that use it take it from constants
        assert value is constants.IGNORE_INDEX
    for module in (bertforge.data, bertforge.data.instances):  # the old name NO_LABEL is gone
        assert not hasattr(module, "NO_LABEL")


def test_no_literal_ignore_index_in_the_package():
    """-100 as a number appears only in bertforge/core/constants.py (io.py's _AT_FDCWD is Linux's, another thing)."""
    root = Path(bertforge.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
                  if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)]
        for minus, number in zip(tokens, tokens[1:]):
            if minus.string == "-" and number.type == tokenize.NUMBER and number.string == "100":
                line = path.read_text(encoding="utf-8").splitlines()[minus.start[0] - 1]
                found.append(f"{path.relative_to(root)}: {line.split('=')[0].strip()}")
    assert found == ["core/constants.py: IGNORE_INDEX", "core/io.py: _AT_FDCWD"]


def test_bundled_corpora_are_defined_once():
    """The bundled real-text corpus (The Devil's Dictionary: the data stream's default and int8 calibration's text)
    and the demo corpus (what `pretrain` trains on when given none) are each one path, named in one module."""
    from bertforge.data import DEFAULT_CORPUS
    from bertforge.data.corpus import DEFAULT_CORPUS as corpus_default
    from bertforge.data.demo_world import DEMO_CORPUS
    from bertforge.pretrain.trainer import DEMO_CORPUS as pretrain_default

    assert DEFAULT_CORPUS is corpus_default and DEFAULT_CORPUS.is_file()
    assert DEMO_CORPUS is pretrain_default and DEMO_CORPUS.is_file() and DEMO_CORPUS != DEFAULT_CORPUS


def test_task_lists_are_two_named_things():
    """Fine-tuning tasks (`--task` of finetune / evaluate / predict) and pipeline tasks are different lists, each
    under its own name only (the old shared name `TASKS` is gone from both)."""
    import bertforge.finetune
    import bertforge.finetune.config
    import bertforge.pipelines
    from bertforge.finetune import FINETUNE_TASKS
    from bertforge.finetune.tasks import TASK_CLASSES
    from bertforge.pipelines import PIPELINE_CLASSES

    assert FINETUNE_TASKS == tuple(TASK_CLASSES) == ("classification", "ner", "qa", "rerank", "multiple-choice")
    assert "question-answering" in PIPELINE_CLASSES
    for module in (bertforge.finetune, bertforge.finetune.config, bertforge.pipelines):
        assert not hasattr(module, "TASKS")
