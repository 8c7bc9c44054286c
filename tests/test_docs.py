"""The documentation cannot rot: every ```python block of each page of docs/ runs as written, top to bottom in one
fresh namespace per page, in a temporary working directory; every repository path a page names
(`bertforge/...`, `bench/...`, `tests/...`, `docs/...`, a `file.py::test_name`) exists, and every `bertforge.x.y`
name in a code span imports; the site builds with `mkdocs build --strict` (a broken link, anchor or API reference
fails); the README stays short and keeps the two set-up commands, and its own Python blocks run.

A page whose blocks take long carries `<!-- docs-test: slow -->` and runs with `-m slow`; code not meant to run is
a ```text (or ```bash) block.
"""

from __future__ import annotations

import ast
import html
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import import_dotted

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(p for p in DOCS.rglob("*.md"))
SLOW_MARK = "<!-- docs-test: slow -->"
README_MAX_LINES = 150

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.MULTILINE | re.DOTALL)
# a repository path: one of the top folders, then path characters; not part of a longer word or path
REPO_PATH = re.compile(r"(?<![\w./~<-])((?:bertforge|bench|tests|docs)/[\w./*-]*)(::(\w+))?")
CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
DOTTED = re.compile(r"^(bertforge(?:\.\w+)+)(?:\(.*\))?$")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block, indented blocks (inside a list) dedented."""
    return [(m["lang"], textwrap.dedent(m["body"])) for m in FENCE.finditer(text)]


def python_blocks(text: str) -> list[str]:
    return [code for lang, code in code_blocks(text) if lang in ("python", "py")]


def run_blocks(name: str, blocks: list[str], workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workdir)
    namespace: dict = {"__name__": "__docs__"}
    for i, code in enumerate(blocks, 1):
        try:
            exec(compile(code, f"{name} (python block {i})", "exec"), namespace)
        except Exception as err:
            raise AssertionError(f"{name}: python block {i} failed: {type(err).__name__}: {err}\n{code}") from err


def page_params():
    params = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        if not python_blocks(text):
            continue
        marks = [pytest.mark.slow] if SLOW_MARK in text else []
        params.append(pytest.param(page, marks=marks, id=rel(page)))
    return params


@pytest.mark.parametrize("page", page_params())
def test_python_blocks_run(page, tmp_path, monkeypatch):
    run_blocks(rel(page), python_blocks(page.read_text(encoding="utf-8")), tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------------- paths, names


def module_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    """The repository paths `text` names that do not exist (globs must match something; `::name` must be a
    module-level function or class of the file)."""
    problems = []
    for m in REPO_PATH.finditer(text):
        path, name = m.group(1).rstrip(".,;:"), m.group(3)
        if "*" in path:
            if not any(root.glob(path)):
                problems.append(f"{path}: matches nothing")
            continue
        target = root / path
        if not target.exists():
            problems.append(f"{path}: does not exist")
        elif name and (target.suffix != ".py" or name not in module_functions(target)):
            problems.append(f"{path}::{name}: no such function")
    return problems


def resolves(dotted: str) -> bool:
    """Whether `bertforge.a.b.c` is a module, or an attribute of the longest module prefix that imports."""
    try:
        import_dotted(dotted)
    except LookupError:
        return False
    return True


def unresolved_names(text: str) -> list[str]:
    """`bertforge.x.y` names in code spans that do not import."""
    names = {m.group(1) for span in CODE_SPAN.findall(text) if (m := DOTTED.match(span.strip()))}
    return sorted(f"{name}: does not import" for name in names if not resolves(name))


@pytest.mark.parametrize("page", [*PAGES, README, ROOT / "ARCHITECTURE.md"], ids=lambda p: rel(p))
def test_every_path_and_name_a_page_names_exists(page):
    text = page.read_text(encoding="utf-8")
    problems = missing_paths(text) + unresolved_names(text)
    assert not problems, f"{rel(page)}:\n" + "\n".join(problems)


def test_the_checks_catch_a_missing_path_test_and_name():
    text = ("`bertforge/no_such.py`, `tests/test_docs.py::test_no_such_test`, `bench/*.nothing`, "
            "`bertforge.no_such_module.thing`, `bertforge.BertModel.no_such_attribute`")
    assert len(missing_paths(text)) == 3, missing_paths(text)
    assert len(unresolved_names(text)) == 2, unresolved_names(text)
    fine = "`bertforge/cli.py`, `tests/test_docs.py::test_the_checks_catch_a_missing_path_test_and_name`, `bench/*.py`"
    assert missing_paths(fine) == [] and unresolved_names("`bertforge.BertModel.from_pretrained`") == []


def test_a_failing_block_names_its_page_and_block(tmp_path, monkeypatch):
    blocks = python_blocks("text\n\n```python\nx = 1\n```\n\n- a list:\n\n    ```python\n    y = x + nope\n    ```\n")
    assert blocks == ["x = 1\n", "y = x + nope\n"]
    with pytest.raises(AssertionError, match=r"page.md: python block 2 failed: NameError"):
        run_blocks("page.md", blocks, tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------------- README


def test_readme_is_short_and_keeps_the_two_set_up_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES, f"README.md has {len(text.splitlines())} lines"
    setups = [code for lang, code in code_blocks(text) if lang == "bash" and code.startswith("python3 -m venv")]
    assert setups == [
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[plots]' && bertforge pretrain\n",
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && pytest\n",
    ], setups
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    # CI: the README's install (quiet), one step a line; ruff and mypy; then exactly the README's test command
    steps = ["python3 -m venv .venv", ". .venv/bin/activate", "pip install -q -e '.[test]'",
             "ruff check bertforge tests bench", "mypy bertforge", "pytest"]
    assert [line for line in ci if line in steps] == steps, ci


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    """README's Python quick start runs against a model directory at the path it names (`path/to/model`): a tiny
    BERT with its MLM head and a vocabulary trained on the bundled demo corpus."""
    from bertforge import BertConfig, BertForMaskedLM, Tokenizer
    from bertforge.data.demo_world import DEMO_CORPUS

    model_dir = tmp_path / "path" / "to" / "model"
    tokenizer = Tokenizer.train(DEMO_CORPUS, vocab_size=500, show_progress=False)
    BertForMaskedLM(BertConfig.preset("tiny", vocab_size=tokenizer.vocab_size)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.md has no Python quick start"
    run_blocks("README.md", blocks, tmp_path, monkeypatch)


def test_using_a_model_commands_run_on_a_two_layer_model(tmp_path, monkeypatch):
    """docs/guides/using-a-model.md's "The commands" block, each line through `bertforge`'s own entry point, on a
    2-layer BERT with an MLM head (the demo's shape): an option out of range for it (`--layer 4`) fails here."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("onnxruntime")
    from bertforge import BertConfig, BertForMaskedLM, Tokenizer
    from bertforge.cli import main
    from bertforge.data.demo_world import DEMO_CORPUS

    model_dir = tmp_path / "DIR"
    tokenizer = Tokenizer.train(DEMO_CORPUS, vocab_size=500, show_progress=False)
    BertForMaskedLM(BertConfig.preset("tiny", vocab_size=tokenizer.vocab_size)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (tmp_path / "texts.txt").write_text("the dog barks.\nsnow is white.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    page = (ROOT / "docs" / "guides" / "using-a-model.md").read_text(encoding="utf-8")
    block = page.split("## The commands")[1].split("```bash\n")[1].split("```")[0]
    lines = [line.split("  #")[0] for line in block.splitlines() if line.strip()]
    assert len(lines) >= 5, lines
    for line in lines:
        argv = shlex.split(line)
        assert argv[0] == "bertforge", line
        assert main(argv[1:]) == 0, line
    assert (tmp_path / "attention.png").stat().st_size > 1000 and (tmp_path / "model.onnx").exists()


# ---------------------------------------------------------------------------------------------------- the site


def build_site(config: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of `config` into `site`. Not `--quiet`: with it, mkdocs 1.6 drops the warnings before
    strict mode counts them and exits 0 with broken links."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, a page outside the nav, a docstring reference that does not
    resolve, or an include that is missing fails the build. The generated command-line reference is checked in the
    built page."""
    site = tmp_path / "site"
    done = build_site(ROOT / "mkdocs.yml", site)
    assert done.returncode == 0, done.stdout + done.stderr
    course = (site / "learn" / "01-embeddings" / "index.html").read_text(encoding="utf-8")
    assert "stylesheets/extra.css" in course  # long code lines wrap in the column rather than run off it
    assert "white-space: pre-wrap" in (site / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    cli_page = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    from bertforge.cli import build_parser, subcommands
    sys.path.insert(0, str(DOCS / "hooks"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(DOCS / "hooks"))
    markdown = cli_reference.render()
    for name, parser in subcommands(build_parser()).items():
        assert f"bertforge {name}" in cli_page, name
        module = __import__(f"bertforge.commands.{name.replace('-', '_')}", fromlist=["EXAMPLES"])
        for example in module.EXAMPLES:  # the usage examples, as `--help` ends with them
            assert f"\n{example}\n" in markdown, f"{name}: {example} missing"
            last = shlex.split(example, comments=True)[-1]  # one highlighted token of it on the page
            assert html.escape(last, quote=False) in cli_page, f"{name}: {example} missing"
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help", "--debug"):
                    assert flag in cli_page, f"{name} {flag} missing from the command-line reference"


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    """The build as the test runs it fails on what mkdocs.yml's `validation` turns into warnings."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^strict: true$", config, re.MULTILINE)
    found = re.search(r"^validation:\n(?:  \w+: warn\n)+", config, re.MULTILINE)
    assert found and "anchors: warn" in found.group(0) and "not_found: warn" in found.group(0), "mkdocs.yml validation"
    validation = found.group(0)
    for broken in ("[x](no-such-page.md)", "[x](other.md#no-such-anchor)"):
        (tmp_path / "docs").mkdir(exist_ok=True)
        (tmp_path / "docs" / "index.md").write_text(f"# Home\n\n{broken}\n", encoding="utf-8")
        (tmp_path / "docs" / "other.md").write_text("# Other\n", encoding="utf-8")
        (tmp_path / "mkdocs.yml").write_text(f"site_name: t\nstrict: true\n{validation}nav: [index.md, other.md]\n",
                                             encoding="utf-8")
        done = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
        assert done.returncode != 0 and "WARNING" in done.stderr, (broken, done.stderr)


def test_the_http_api_page_documents_every_route_the_server_declares():
    """docs/reference/http-api.md has a `## METHOD /path` section for each route of `create_app`, and no other."""
    from types import SimpleNamespace

    from bertforge.serve import ROUTES, create_app

    app = create_app(engine=SimpleNamespace(metrics=None))  # the routes only: nothing is served or loaded
    declared = {(method, route.path) for route in app.routes for method in route.methods - {"HEAD"}}
    text = (DOCS / "reference" / "http-api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^## (GET|POST|PUT|DELETE) (/\S*)$", text, re.MULTILINE))
    assert documented == declared, f"documented, not declared: {documented - declared}; " \
                                   f"declared, not documented: {declared - documented}"
    assert {path for _, path in declared} == set(ROUTES)


# ---------------------------------------------------------------------------------------------------- commands


def command_lines(text: str) -> list[str]:
    """The `bertforge ...` command lines of the ```bash blocks (continuations joined, comments dropped), from
    `bertforge` on (after `torchrun ... -m`)."""
    found = []
    for lang, code in code_blocks(text):
        if lang not in ("bash", "sh", "console"):
            continue
        for line in code.replace("\\\n", " ").splitlines():
            line = " ".join(line.split(" #", 1)[0].split())
            m = re.search(r"(?:^|-m )(bertforge \S.*)$", line)
            if m and not line.startswith(("pip", "python3 -m venv")):
                found.append(m.group(1))
    return found


def without_substitutions(line: str) -> str:
    """`line` with each `$(...)` (parentheses nested inside included) replaced by VALUE."""
    out, depth = [], 0
    i = 0
    while i < len(line):
        if line.startswith("$(", i) and depth == 0:
            depth, i = 1, i + 2
            out.append("VALUE")
            continue
        if depth:
            depth += {"(": 1, ")": -1}.get(line[i], 0)
        else:
            out.append(line[i])
        i += 1
    return "".join(out)


def refused(line: str) -> str | None:
    """Why the command line's parser refuses `line` (None when it parses). `...` and `$(...)` stand for values."""
    import contextlib
    import io
    import shlex

    from bertforge.cli import build_parser

    try:
        words = [w for w in shlex.split(without_substitutions(line)) if w != "..."][1:]
    except ValueError as bad:  # an unclosed quote
        return str(bad)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(words)
    except SystemExit as stop:
        return None if stop.code == 0 else err.getvalue().strip() or f"exit {stop.code}"
    return None


@pytest.mark.parametrize("page", [*PAGES, README], ids=lambda p: rel(p))
def test_every_command_line_a_page_shows_parses(page):
    """Each `bertforge ...` line of a page's shell blocks names a real command and real options."""
    problems = [f"{line}\n    {why}" for line in command_lines(page.read_text(encoding="utf-8"))
                if (why := refused(line))]
    assert not problems, f"{rel(page)}:\n" + "\n".join(problems)


def test_the_command_check_catches_a_wrong_option():
    lines = command_lines("```bash\nbertforge embed --model m --input a.txt \\\n    --out v.npy --no-such-option 3\n"
                          "torchrun --nproc-per-node 2 -m bertforge pretrain --out r   # comment --bad\n```\n")
    assert lines == ["bertforge embed --model m --input a.txt --out v.npy --no-such-option 3",
                     "bertforge pretrain --out r"]
    assert "unrecognized arguments: --no-such-option" in refused(lines[0])
    assert refused(lines[1]) is None
    assert refused('bertforge embed --model $(python -c "print(f(x))") --input a.txt --out v.npy') is None
    assert "required" in refused("bertforge embed --model m")


BENCH_RUN = re.compile(r"(bench/\w+\.py)((?: --?[\w-]+(?: (?!--)[^\s`;,)]+)*)+)")


def unknown_bench_flags(text: str) -> list[str]:
    """`bench/x.py --flag` in `text` whose script declares no such option (its source names no "--flag")."""
    problems = []
    for m in BENCH_RUN.finditer(text):
        script = ROOT / m.group(1)
        source = script.read_text(encoding="utf-8") if script.is_file() else ""
        problems += [f"{m.group(1)} {flag}: no such option" for flag in re.findall(r"--[\w-]+", m.group(2))
                     if f'"{flag}"' not in source]
    return problems


@pytest.mark.parametrize("page", [*PAGES, README], ids=lambda p: rel(p))
def test_every_benchmark_command_names_real_options(page):
    problems = unknown_bench_flags(page.read_text(encoding="utf-8"))
    assert not problems, f"{rel(page)}:\n" + "\n".join(problems)


def test_the_benchmark_check_catches_a_wrong_option():
    assert unknown_bench_flags("`bench/train_speed.py --configs mini --no-such-flag 3`") == [
        "bench/train_speed.py --no-such-flag: no such option"]
    assert unknown_bench_flags("python bench/embed_speed.py --n 2000 --threads 2") == []
