"""The objectives `--objective` names, in one table (`OBJECTIVES`). Each entry (`objectives.ObjectiveKind`) lives
beside its code — MLM, NSP and SOP in `objectives`, replaced-token detection in `rtd` — and declares what a run
needs of it (its model and `Objective`, the memory check's config, its data, its own settings, the families it
refuses), so the `Pretrainer` runs whichever the settings name and nothing compares objective names. A new
objective is its entry and a line here. Distillation's entry (`distill.DISTILLATION`) is not in the table: its
command, `bertforge distill`, names it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from ..core.errors import BertforgeError
from .objectives import MLM, NSP, SOP, ObjectiveKind
from .rtd import RTD

#: `--objective NAME` -> its entry (`objectives.ObjectiveName` types the names)
OBJECTIVES: dict[str, ObjectiveKind] = {kind.name: kind for kind in (MLM, NSP, SOP, RTD)}
AUTO = "auto"  # `--objective auto`: the family's recipe (`PretrainArgs.for_family`)


class ObjectiveChoices(Sequence[str]):
    """`--objective`'s choices: "auto" and the registered names, read from `OBJECTIVES` when asked, so that an
    entry registered later (a test's) is a choice too. A sequence, as argparse's other choices are."""

    def __contains__(self, name: object) -> bool:
        return name == AUTO or name in OBJECTIVES

    def __iter__(self) -> Iterator[str]:
        return iter((AUTO, *OBJECTIVES))

    def __len__(self) -> int:
        return 1 + len(OBJECTIVES)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return (AUTO, *OBJECTIVES)[index]


OBJECTIVE_CHOICES = ObjectiveChoices()


def objective_kind(name: str) -> ObjectiveKind:
    """The entry `--objective name` names; an unknown name is refused in one line that lists the registered ones."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise BertforgeError(f"unknown objective {name!r}; the registered objectives are "
                             f"{', '.join(OBJECTIVES)}") from None


def owners(setting: str) -> list[str]:
    """The registered objectives that read `setting` alone (`ObjectiveKind.settings`: --generator-layers, RTD's)."""
    return [name for name, kind in OBJECTIVES.items() if setting in kind.settings]


def own_settings() -> set[str]:
    """Every setting some registered objective reads alone."""
    return {setting for kind in OBJECTIVES.values() for setting in kind.settings}


__all__ = ["AUTO", "OBJECTIVES", "OBJECTIVE_CHOICES", "ObjectiveChoices", "objective_kind", "owners", "own_settings"]
