"""ARCHITECTURE.md stays a five-minute map: at most `MAX_WORDS` words (counted as `wc -w` counts: runs of
non-whitespace), its layering table lists the folders of `tests.test_architecture.LAYER_FOLDERS`, and every module
and name it writes in backticks exists.

Which backticked spans are names. A span is one `...` outside a fenced block, a trailing `()` ignored. Only the
forms below are checked; everything else (options such as `--config`, files such as `config.json`, field values,
`OUT/model`, bare words such as `model_type` or `forward_backward`) is prose.

1. A path: a span with a `/` (or ending in `.py`), without spaces, `<`, `*` or `|`, whose first part is `bertforge`,
   `tests`, `docs`, `bench`, or a top-level name of the package (`model/encoder.py`, `commands/`, read relative to
   bertforge/). It must exist.
2. A dotted module name: identifiers joined by dots whose first is `bertforge`, a top-level folder or root module of
   the package (`training.loop.TrainLoop`, `cli.main`), or else the stem of exactly one module or subpackage
   (`system.setup_runtime` is `core.system.setup_runtime`; an ambiguous stem such as `config` is not a name). A span
   whose last part is a file suffix (`model.safetensors`, `metrics.jsonl`) is a file name, not checked. It must
   resolve: the longest prefix that imports as a module, then `getattr` for each remaining part.
3. A dotted class name: identifiers joined by dots whose first is capitalised (`TrainStep.accumulate`,
   `Family.read_spec`): exactly one module of the package must define a class of that name, and each remaining part
   must be an attribute of it.
4. A name relative to a module: a span written right after a module's span and `'s ` (`model/spec.py`'s
   `EncoderSpec`, or after a dotted module) is looked up in that module, and must be an attribute of it (a dotted
   span: a chain of attributes). Bare names anywhere else are not checked: write a name in one of these forms where
   it should be. (Such a span is checked in its module only, not also by rules 2 and 3.)
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import bertforge
from tests.helpers import import_dotted
from tests.test_architecture import LAYER_FOLDERS

PACKAGE = Path(bertforge.__file__).parent
REPO = PACKAGE.parent
MAP = REPO / "ARCHITECTURE.md"
MAX_WORDS = 1500

FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
POSSESSIVE = re.compile(r"(?<!`)`([^`\n]+)`'s `([^`\n]+)`(?!`)")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
IDENTIFIER = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
FILE_SUFFIXES = {"py", "json", "jsonl", "txt", "md", "safetensors", "bin", "gz", "png", "onnx", "tsv", "csv",
                 "parquet", "yml", "yaml", "toml", "html"}
REPO_FOLDERS = ("bertforge", "tests", "docs", "bench")


def prose(text: str) -> str:
    """`text` without its fenced blocks."""
    return FENCE.sub("", text)


@cache
def top_level() -> frozenset[str]:
    """The package's top-level folders and root modules (`model`, `cli`, ...)."""
    return frozenset(p.name.removesuffix(".py") for p in PACKAGE.iterdir()
                     if (p.is_dir() and (p / "__init__.py").is_file()) or p.suffix == ".py")


@cache
def stems() -> dict[str, list[str]]:
    """Each module's (and subpackage's) last name -> the dotted paths below the package that end in it."""
    found: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts[-1] != "__main__":
            found.setdefault(parts[-1], []).append(".".join(parts))
    return found


@cache
def classes() -> dict[str, list[str]]:
    """Each class name -> the modules (dotted, below the package) whose source defines a class of that name."""
    found: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(module)
    return found


def clean(span: str) -> str:
    span = span.strip()
    return span[:-2] if span.endswith("()") else span


def is_path(span: str) -> bool:
    if any(c in span for c in " <*|") or not ("/" in span or span.endswith(".py")):
        return False
    return span.split("/")[0].removesuffix(".py") in {*REPO_FOLDERS, *top_level()}


def path_exists(span: str) -> bool:
    first = span.split("/")[0]
    return (REPO / span).exists() if first in REPO_FOLDERS else (PACKAGE / span).exists()


def module_of_path(span: str) -> str | None:
    """The dotted module (with `bertforge.`) a path span names, if it names a Python module or package."""
    path = (REPO / span) if span.split("/")[0] in REPO_FOLDERS else (PACKAGE / span)
    try:
        parts = path.resolve().relative_to(PACKAGE.resolve().parent).with_suffix("").parts
    except ValueError:
        return None
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts and parts[0] == "bertforge" else None


def absolute(span: str) -> str | None:
    """The `bertforge.`-qualified name a dotted module span stands for (rule 2), None when it is not one."""
    if not DOTTED.match(span) or span.rsplit(".", 1)[1] in FILE_SUFFIXES:
        return None
    first, _, rest = span.partition(".")
    if first == "bertforge":
        return span
    if first in top_level():
        return f"bertforge.{span}"
    if len(stems().get(first, [])) == 1:
        return f"bertforge.{stems()[first][0]}.{rest}"
    return None


def resolve(dotted: str) -> object | None:
    """The object `bertforge.a.b.c` names: the longest prefix that imports as a module, then attributes."""
    try:
        return import_dotted(dotted)
    except LookupError:
        return None


def attribute_chain(obj: object, dotted: str) -> bool:
    try:
        for attr in dotted.split("."):
            obj = getattr(obj, attr)
    except AttributeError:
        return False
    return True


def problems(text: str) -> list[str]:
    """What `text` names in backticks (rules 1-4 of the module docstring) that does not exist."""
    text = prose(text)
    found = []
    relative = {m.start(2) - 1 for m in POSSESSIVE.finditer(text)}  # spans rule 4 reads in their module
    for m in SPAN.finditer(text):
        raw, span = m.group(1), clean(m.group(1))
        if m.start() in relative:
            continue
        if is_path(span):
            if not path_exists(span):
                found.append(f"`{raw}`: no such path")
        elif (name := absolute(span)) is not None:
            if resolve(name) is None:
                found.append(f"`{raw}`: {name} does not resolve")
        elif DOTTED.match(span) and span[0].isupper():
            first, _, rest = span.partition(".")
            homes = classes().get(first, [])
            if len(homes) != 1:
                found.append(f"`{raw}`: {len(homes)} modules define a class {first} (name its module)")
            elif not attribute_chain(resolve(f"bertforge.{homes[0]}.{first}"), rest):
                found.append(f"`{raw}`: {homes[0]}.{first} has no {rest}")
    for raw_module, raw_name in POSSESSIVE.findall(text):
        module_span, name = clean(raw_module), clean(raw_name)
        if not IDENTIFIER.match(name):
            continue
        module = module_of_path(module_span) if is_path(module_span) else absolute(module_span)
        if module is None and DOTTED.match(module_span) is None and module_span in top_level():
            module = f"bertforge.{module_span}"
        target = resolve(module) if module else None
        if target is None or not hasattr(target, "__file__"):
            continue  # not a module's possessive ("`OUT`'s `x`"); a missing module is reported above
        if not attribute_chain(target, name):
            found.append(f"`{raw_module}`'s `{raw_name}`: {module} has no {name}")
    return found


def layer_table(text: str) -> dict[int, set[str]]:
    """The folders (and root modules) each row `| N. name | `a/`, `b.py` | ... |` of the layering table lists."""
    rows = {}
    for m in re.finditer(r"^\| (\d+)\. [^|]+\| ([^|]+)\|", text, re.MULTILINE):
        rows[int(m.group(1))] = {s.rstrip("/").removesuffix(".py") for s in SPAN.findall(m.group(2))}
    return rows


def test_the_map_is_at_most_1500_words():
    words = len(MAP.read_text(encoding="utf-8").split())
    assert words <= MAX_WORDS, f"ARCHITECTURE.md has {words} words (at most {MAX_WORDS}): move detail to docstrings"


def test_every_module_and_name_the_map_writes_exists():
    found = problems(MAP.read_text(encoding="utf-8"))
    assert not found, "ARCHITECTURE.md names what does not exist:\n" + "\n".join(found)


def test_the_layering_table_lists_the_layers_the_import_check_uses():
    table = layer_table(MAP.read_text(encoding="utf-8"))
    expected = {n: set(folders) - {"__init__", "__main__"} for n, folders in enumerate(LAYER_FOLDERS, 1)}
    assert table == expected


def test_the_checks_catch_a_misspelt_name_in_each_form():
    wrong = ["`model/encodr.py`", "`training/no_such/`", "`training.loop.TrainLop`", "`cli.no_such_function`",
             "`system.setup_runtme`", "`TrainStep.acumulate`", "`NoSuchClass.method`",
             "`model/spec.py`'s `EncoderSpek`", "`training.loop`'s `TrainLoop.no_such`"]
    for text in wrong:
        assert len(problems(text)) == 1, (text, problems(text))
    right = ("`model/encoder.py`, `bertforge/training/`, `tests/test_architecture.py`, `training.loop.TrainLoop`, "
             "`cli.main`, `system.setup_runtime()`, `TrainStep.accumulate`, `model/spec.py`'s `EncoderSpec`, "
             "`training.loop`'s `TrainLoop.run`, `bertforge.model.families.FAMILIES`")
    assert problems(right) == []
    prose_only = ("`--config`, `config.json`, `model.safetensors`, `OUT/checkpoints/step-N/`, `model_type`, "
                  "`BertFor*`, `bertforge/<dir>/<name>.py`, `config.NoSuchThing`, `OUT`'s `x`, `.backward()`")
    assert problems(prose_only) == [], problems(prose_only)
