"""bertforge's tests: a package, so that every test directory imports the shared helpers the same way
(`from tests.helpers import ...`).

Layout: `bertforge/<dir>/<name>.py` is tested in `tests/<dir>/test_<name>.py`, a module with several topics split as
`test_<name>_<topic>.py` beside it (`tests/pretrain/test_trainer_budget.py`); `tests/test_architecture.py` checks the
mirror. `tests/commands/` holds what runs a command through the CLI (its options, defaults, exit status and one-line
errors); the library behind a command is tested in the library's mirror file. `tests/reliability/` is the exception:
what users do wrong, across modules.

Helpers shared between directories (tiny vocabularies and tokenizer files, the tiny corpus and config, a short run's
`PretrainArgs`) are in `tests/helpers.py` and shared fixtures in `tests/conftest.py`; a directory's own fixtures are
in its `conftest.py` (session-scoped where they build a checkpoint the tests only read) and its own helpers in
`<dir>_helpers.py` beside its tests (`tests/data/data_helpers.py`, `tests/commands/cmd_helpers.py`)."""
