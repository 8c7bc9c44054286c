"""ARCHITECTURE.md's layering, checked: a module imports only from its own layer or the layers below it, and
attention, backward and gradient clipping each live in one module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import bertforge

ROOT = Path(bertforge.__file__).parent

#: the layers, bottom up, as in ARCHITECTURE.md's table: each is a set of top-level folders of the package (the
#: only root modules are the command line's `cli.py` and the package's `__init__.py` / `__main__.py`)
LAYER_FOLDERS = (
    ("core",),
    ("model",),
    ("tokenizer", "data"),
    ("training", "pretrain", "finetune", "embeddings_train", "evaluation"),
    ("pipelines", "serve"),
    ("commands", "cli", "__main__", "__init__"),
)
LAYERS = {folder: n for n, folders in enumerate(LAYER_FOLDERS, 1) for folder in folders}


def layer_of(module: str) -> int:
    return LAYERS[module.split(".")[0]]


def test_the_root_holds_only_folders_and_the_entry_points():
    """A module belongs to the layer of its folder: no loose module at the package root but the entry points."""
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "cli.py"]


def imports(path: Path, text: str | None = None) -> list[str]:
    """The bertforge modules `path` (holding `text`, by default its contents) imports, relative imports resolved,
    as dotted paths below the package."""
    own = path.relative_to(ROOT).with_suffix("").parts
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8") if text is None else text)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(own[: len(own) - node.level])
                if node.module:
                    found.append(".".join(base + [node.module]))
                elif base:  # `from . import metrics` inside a subpackage
                    found += [".".join(base + [alias.name]) for alias in node.names]
                # `from .. import __version__`: the package's version string, no layer
            elif node.module and node.module.startswith("bertforge."):
                found.append(node.module.removeprefix("bertforge."))
        elif isinstance(node, ast.Import):
            found += [a.name.removeprefix("bertforge.") for a in node.names if a.name.startswith("bertforge.")]
    return found


def test_every_module_has_a_layer():
    top = {p.relative_to(ROOT).parts[0].removesuffix(".py") for p in ROOT.rglob("*.py")}
    assert top <= set(LAYERS), f"add {sorted(top - set(LAYERS))} to LAYERS and ARCHITECTURE.md"


def test_imports_go_down_the_layers():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if name.startswith(("__init__", "__main__")):
            continue
        for target in imports(path):
            if layer_of(target) > layer_of(name):
                upward.append(f"{name} (layer {layer_of(name)}) imports {target} (layer {layer_of(target)})")
    assert not upward, "\n".join(upward)


def test_one_module_each_for_attention_backward_and_clipping():
    where: dict[str, set[str]] = {"scaled_dot_product_attention": set(), r"\.backward\(": set(), "clip_grad_norm_": set()}
    for path in ROOT.rglob("*.py"):
        code = "\n".join(line.split("#")[0] for line in path.read_text(encoding="utf-8").splitlines())
        for pattern, files in where.items():
            if re.search(pattern, code):
                files.add(path.relative_to(ROOT).as_posix())
    assert where == {"scaled_dot_product_attention": {"model/attention.py"}, r"\.backward\(": {"training/step.py"},
                     "clip_grad_norm_": {"training/step.py"}}


def test_the_checker_sees_an_upward_import():
    """The layer check is not vacuous: a data module importing the pipelines would be caught."""
    probe = ROOT / "data" / "probe.py"
    found = imports(probe, "from ..pipelines.base import Pipeline\nfrom .corpus import take_mb\n")
    assert found == ["pipelines.base", "data.corpus"]
    assert layer_of("pipelines.base") > layer_of("data.probe") == layer_of("data.corpus")


def test_every_module_has_a_test_module_in_the_mirror_place():
    """bertforge/<dir>/<name>.py is tested in tests/<dir>/test_<name>.py (topic splits: test_<name>_<topic>.py)."""
    tests = Path(__file__).parent
    missing = [f"{path.relative_to(ROOT)} -> tests/{mirror.relative_to(tests)}"
               for path in sorted(ROOT.rglob("*.py")) if path.name not in ("__init__.py", "__main__.py")
               for mirror in [tests / path.relative_to(ROOT).parent / f"test_{path.name}"] if not mirror.is_file()]
    assert not missing, "modules without their test module:\n" + "\n".join(missing)
    packages = [d for d in tests.rglob("*") if d.is_dir() and d.name != "__pycache__"]
    assert all((d / "__init__.py").is_file() for d in packages), "every test directory is a package (same-named files)"
