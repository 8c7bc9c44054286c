"""The course's pages run: every ```python block of docs/learn/*.md and docs/exercises/*.md, top to bottom.

How a page's code is run (the docs site's runner should do the same):

* each page starts with a fresh namespace (``{"__name__": "__main__"}``) in a fresh temporary working directory,
  and its ```python blocks run in the order they appear, sharing that namespace (a later block may use what an
  earlier one defined);
* a fence that is not exactly ```python (```text, ```bash, ```console) is not run;
* a block whose fence line carries ``title="slow"`` (```python title="slow"), or whose fence is preceded, on the
  line just above it, by the HTML comment ``<!-- slow -->``, runs only under ``pytest -m slow``: by default it is
  skipped, and no later block of the page may need what it defines.

* the docs site's own runner (tests/test_docs.py) runs a page's blocks all or none: a page with a slow block also
  carries ``<!-- docs-test: slow -->`` (checked below), so that the site's default run skips it while this file
  still runs its quick blocks;
* torch runs on one thread while a page runs (restored afterwards): the pages' models are tiny, and on a shared
  machine one thread is several times faster than two that wait for each other.

What a page shows a block printing is checked too: a ```text block that is the next fence after a ```python block
is that block's output (`shown_outputs`), and its lines must be a run of the lines the block printed (`same_output`):
the words exactly, the numbers within 1 % (or 10⁻⁵ for numbers near 0: rounding noise of another CPU), `...` standing
for any text, and times (a number of s, ms or min) not compared. An output that depends on files the tests may lack
is marked ``<!-- output: needs NAME -->`` on the line above its fence: it is compared only when the environment
variable NAME is set (the slow run sets TASKS_DIR to the shared task files when they are there).

The default run keeps each page to a few seconds (tiny models from ``BertConfig.preset("tiny", ...)``); the slow
run also executes the measured parts (head-only against full fine-tuning, the exercises' solutions).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import time
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted([*DOCS.glob("learn/*.md"), *DOCS.glob("exercises/*.md")])
FENCE = re.compile(r"^```(\S*)(.*)$")
SLOW_COMMENT = "<!-- slow -->"


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
    """(line number of the fence, code, slow?) of each ```python block, in order."""
    blocks: list[tuple[int, str, bool]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        lang, rest = match.group(1), match.group(2)
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        if lang == "python":
            slow = 'title="slow"' in rest or (start > 0 and lines[start - 1].strip() == SLOW_COMMENT)
            blocks.append((start + 1, "\n".join(body) + "\n", slow))
    return blocks


NEEDS = re.compile(r"<!-- output: needs (\w+) -->")
NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+|-?inf|nan")
TIME = re.compile(r" ?(?:s|ms|min)\b")  # after a number: a time, which another machine or day changes


def shown_outputs(text: str) -> dict[int, tuple[int, str, bool]]:
    """For each ```python block (by its fence's line number) whose next fence is a ```text block: (that block's
    line number, its text, whether to compare it now: not when it needs an environment variable that is unset)."""
    lines = text.splitlines()
    fences = [(i, m.group(1)) for i, line in enumerate(lines) if (m := FENCE.match(line)) and m.group(1)]
    shown = {}
    for (start, lang), (then, then_lang) in zip(fences, fences[1:]):
        if lang == "python" and then_lang == "text":
            end = next(i for i in range(then + 1, len(lines)) if lines[i].startswith("```"))
            needs = NEEDS.fullmatch(lines[then - 1].strip()) if then > 0 else None
            shown[start + 1] = (then + 1, "\n".join(lines[then + 1 : end]), needs is None or needs[1] in os.environ)
    return shown


def same_line(shown: str, printed: str) -> bool:
    """A printed line is the one shown: the same words, the numbers within 1 % (or 1e-5 near 0), times (`TIME`)
    not compared, `...` for any text."""
    pattern, expected, last = "", [], 0
    for match in re.finditer(rf"\.\.\.|{NUMBER.pattern}", shown):
        pattern += re.escape(shown[last : match.start()])
        if match.group() == "...":
            pattern += ".*?"
        else:
            pattern += f"({NUMBER.pattern})"
            expected.append((match.group(), TIME.match(shown, match.end()) is not None))
        last = match.end()
    found = re.fullmatch(pattern + re.escape(shown[last:]), printed.rstrip())
    if found is None:
        return False
    for (want, is_time), got in zip(expected, found.groups()):
        a, b = float(want.replace(",", "")), float(got.replace(",", ""))
        if not (is_time or a == b or math.isnan(a) and math.isnan(b) or math.isclose(a, b, rel_tol=0.01, abs_tol=1e-5)):
            return False
    return True


def same_output(shown: str, printed: str) -> bool:
    """The shown lines are a run of the printed ones (a page may show the end of what a block printed)."""
    want, got = shown.splitlines(), printed.rstrip("\n").splitlines()
    return any(all(same_line(w, g) for w, g in zip(want, got[k : k + len(want)]))
               for k in range(len(got) - len(want) + 1))


# The default run runs the slow blocks too, made small by these replacements of their text (each must be found):
# the exercises' solutions, end to end in seconds, their printouts unchecked (they are the full runs').
REDUCED: dict[str, tuple[tuple[str, str], ...]] = {
    "exercises/01-mlm-pretraining.md": (('"max_steps": 600, "save_every": 600', '"max_steps": 12, "save_every": 12'),),
    "exercises/02-fine-tuning.md": (("epochs=2, batch_size=16", "epochs=1, batch_size=16"),),
    "learn/08-fine-tuning.md": (("for lr in (1e-5, 2e-5, 5e-5, 2e-4, 1e-3):", "for lr in (1e-3,):"),
                                ('sentences("train.tsv", 2000), sentences("test.tsv", 872)',
                                 'sentences("train.tsv", 64), sentences("test.tsv", 32)'),
                                ('tagged("train.txt", 1000), tagged("valid.txt", 500)', 'tagged("train.txt", 16), tagged("valid.txt", 8)'),
                                ("for _ in range(300):", "for _ in range(3):")),
}


def reduce(page: Path, text: str) -> str:
    """The page with its `REDUCED` replacements made."""
    for old, new in REDUCED.get(str(page.relative_to(DOCS)), ()):
        assert old in text, f"{page.relative_to(DOCS)}: REDUCED's {old!r} is no longer in the page"
        text = text.replace(old, new)
    return text


def run_page(page: Path, workdir: Path, slow: bool) -> int:
    """Run the page's blocks in `workdir`, each block's printout checked against the output the page shows (`slow`
    False: the slow blocks reduced, by `REDUCED`, and their printouts not checked); returns how many ran."""
    import torch

    text = page.read_text(encoding="utf-8")
    shown = shown_outputs(text)
    if not slow:
        text = reduce(page, text)
    namespace: dict[str, object] = {"__name__": "__main__"}
    ran = 0
    old, threads = Path.cwd(), torch.get_num_threads()
    os.chdir(workdir)
    torch.set_num_threads(1)
    try:
        for line, code, is_slow in python_blocks(text):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(code, f"{page.relative_to(DOCS)}:{line}", "exec"), namespace)  # noqa: S102
            ran += 1
            if line in shown and shown[line][2] and (slow or not is_slow):
                at, output, _ = shown[line]
                assert same_output(output, printed.getvalue()), (
                    f"{page.relative_to(DOCS)}:{at}: the output shown is not what the block at line {line} prints "
                    f"now:\n{printed.getvalue()[-3000:]}")
    finally:
        os.chdir(old)
        torch.set_num_threads(threads)
    return ran


def test_the_output_check_takes_noise_and_ellipses_and_catches_drift() -> None:
    assert same_line("loss 6.69, 74 % right", "loss 6.7, 74 % right")  # within 1 %
    assert same_line("(13, 1536) 9.5367431640625e-07", "(13, 1536) 1.1920928955078125e-06")  # noise near 0
    assert same_line("[-0.0, -3.4028234663852886e+38, ...]", "[-0.0, -3.4028234663852886e+38, -3.4e+38, -3.4e+38]")
    assert not same_line("loss 6.69, 74 % right", "loss 6.9, 74 % right")  # 3 %: drifted
    assert not same_line("3 of 12 right", "4 of 12 right")
    assert not same_line("['bert', 'roberta']", "['bert', 'roberta', 'mpnet']")
    assert same_line("[nan, 0.25]", "[nan, 0.25]") and not same_line("[nan, 0.25]", "[0.25, 0.25]")
    assert same_line("accuracy 0.758 (592 s), 12 ms a step", "accuracy 0.760 (131 s), 40 ms a step")  # times
    assert not same_line("accuracy 0.758 (592 s)", "accuracy 0.858 (592 s)")
    assert not same_line("208 s in all", "131 s total")
    assert same_output("b 2\nc 3", "a 1\nb 2\nc 3\n") and not same_output("a 1\nc 3", "a 1\nb 2\nc 3\n")
    page = "```python\nprint(1)\n```\n\nprints\n\n```text\n1\n```\n```python\nx = 2\n```\n```bash\nls\n```\n"
    assert shown_outputs(page) == {1: (7, "1", True)}
    needing = "```python\nprint(1)\n```\n<!-- output: needs NO_SUCH_VARIABLE -->\n```text\n1\n```\n"
    assert shown_outputs(needing) == {1: (5, "1", False)}


def test_the_course_has_its_pages() -> None:
    learn = sorted(p.name for p in DOCS.glob("learn/*.md") if p.name != "index.md")
    exercises = sorted(p.name for p in DOCS.glob("exercises/*.md") if p.name != "checklist.md")
    assert len(learn) >= 10, learn
    assert len(exercises) >= 2, exercises
    assert (DOCS / "exercises" / "checklist.md").exists()


def test_the_block_reader_sees_fences_and_slow_marks() -> None:
    text = "\n".join(["```python", "a = 1", "```", "```text", "not run", "```", SLOW_COMMENT, "```python", "b = 2",
                      "```", '```python title="slow"', "c = 3", "```"])
    assert [(code.strip(), slow) for _, code, slow in python_blocks(text)] == [("a = 1", False), ("b = 2", True),
                                                                              ("c = 3", True)]


def test_a_page_with_a_slow_block_carries_the_sites_slow_mark() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        if any(slow for _, _, slow in python_blocks(text)):
            assert "<!-- docs-test: slow -->" in text, page.name


def test_the_checklist_links_every_page() -> None:
    checklist = (DOCS / "exercises" / "checklist.md").read_text(encoding="utf-8")
    for page in DOCS.glob("learn/*.md"):
        if page.name != "index.md":
            assert f"../learn/{page.name}" in checklist, page.name


def test_links_between_pages_resolve() -> None:
    for page in PAGES + [DOCS / "learn" / "index.md"]:
        for target in re.findall(r"\]\(([^)#:]+\.(?:md|png|py))(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).resolve().exists(), f"{page.name} links to missing {target}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_page_runs(page: Path, tmp_path: Path) -> None:
    start = time.perf_counter()
    run_page(page, tmp_path, slow=False)
    assert time.perf_counter() - start < 120, "a page's default blocks should take seconds, not minutes"


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if any(s for _, _, s in python_blocks(p.read_text("utf-8")))],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_page_runs_with_its_slow_blocks(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = DOCS.parent.parent / "shared" / "data" / "tasks"  # the exercise's real files, where this machine has them
    if (tasks / "sst2").is_dir():
        monkeypatch.setenv("TASKS_DIR", str(tasks))
    run_page(page, tmp_path, slow=True)


def test_the_pages_formulas_become_mathml_outside_code() -> None:
    """docs/hooks/maths.py: each `$$ ... $$` paragraph outside a fence is MathML in the built page (no script, no
    network); a `$` in a sentence or anything in a code block stays as written."""
    import importlib.util
    import types

    import markdown

    spec = importlib.util.spec_from_file_location("maths", DOCS / "hooks" / "maths.py")
    maths = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maths)  # type: ignore[union-attr]
    text = "costs $5 or $6\n\n$$x_i = \\frac{a}{b}$$\n\n```python\n$$kept$$\n```\n"
    swapped, found = maths.formulas(text)
    assert len(found) == 1 and "<mfrac>" in found[0] and "$$kept$$" in swapped and "costs $5 or $6" in swapped
    converted = 0
    for page in PAGES:
        source = page.read_text(encoding="utf-8")
        holder = types.SimpleNamespace()
        html = maths.on_page_content(markdown.markdown(maths.on_page_markdown(source, page=holder)), page=holder)
        assert "bertforgemaths" not in html and "<merror" not in html, page.name
        converted += html.count("<math ")
        assert html.count("<math ") == len(holder.maths), page.name
    assert converted >= 4  # page 1's input sum, page 2's attention, page 3's LayerNorm and GELU


# ---------------------------------------------------------------------------------------------- the pictures
PICTURES = DOCS / "images" / "learn"


def make_pictures():
    """docs/make_pictures.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_pictures", DOCS / "make_pictures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_every_picture_is_committed_small_and_shown() -> None:
    names = set(make_pictures().PICTURES)
    pages = "".join(p.read_text(encoding="utf-8") for p in DOCS.glob("learn/*.md"))
    for name in names:
        png = PICTURES / f"{name}.png"
        assert png.is_file(), f"{png} is missing: run python docs/make_pictures.py"
        assert png.stat().st_size < 150_000, f"{png.name} is {png.stat().st_size:,} bytes"
        assert f"../images/learn/{name}.png" in pages, f"no page shows {png.name}"


def test_the_architecture_picture_records_the_real_shapes(tmp_path: Path) -> None:
    import torch

    from bertforge import BertConfig, BertForPreTraining

    pictures = make_pictures()
    model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=1000)).eval()
    shapes = pictures.recorded_shapes(model, ["bert.embeddings", "bert.encoder.layer.0.intermediate", "bert.pooler",
                                              "cls.predictions"],
                                      {"input_ids": torch.randint(5, 1000, (2, 12)), "sparse_mlm": False})
    assert shapes == {"bert.embeddings": (2, 12, 128), "bert.encoder.layer.0.intermediate": (2, 12, 512),
                      "bert.pooler": (2, 128), "cls.predictions": (2, 12, 1000)}
    assert pictures.architecture(tmp_path).stat().st_size > 10_000


def test_the_input_sum_picture_draws_the_real_ids_and_tables() -> None:
    d = make_pictures().input_sum_data()
    # page 1's printout of the same pair
    assert d["tokens"][:5] == ["[CLS]", "the", "una", "##ffa", "##ble"] and d["tokens"].count("[SEP]") == 2
    assert d["ids"][:3] == [101, 1996, 14477] and d["ids"][11] == d["ids"][-1] == 102
    assert d["types"] == [0] * 12 + [1] * 6
    assert d["tables"] == {"word_embeddings": (30522, 384), "token_type_embeddings": (2, 384),
                           "position_embeddings": (512, 384)}
    assert d["norm"] == "LayerNorm"


def test_the_block_picture_follows_the_specs_norm_placement() -> None:
    from bertforge import BertConfig, BertModel

    pictures = make_pictures()
    post, pre = pictures.block_data("tiny"), pictures.block_data("modernbert-tiny")
    assert post["norm"] == BertConfig.preset("tiny").spec.norm == "post"
    assert pre["norm"] == BertConfig.preset("modernbert-tiny").spec.norm == "pre"
    kinds = lambda d: [k for k, _ in d["steps"] if k != "fork"]  # noqa: E731
    assert kinds(post) == ["sublayer", "add", "norm"] * 2
    assert kinds(pre) == ["norm", "sublayer", "add"] * 2
    assert post["norms"] == ["attention.output.LayerNorm", "output.LayerNorm"]
    assert pre["norms"] == ["attention.norm", "intermediate.norm"] and pre["final_norm"] == "encoder.final_norm"
    assert not pre["first_attention_norm"] and post["final_norm"] is None
    modules = dict(BertModel(BertConfig.preset("modernbert-tiny")).named_modules())
    assert all(f"encoder.layer.1.{name}" in modules for name in pre["norms"])
    assert post["ffn_in"] == (512, 128) and pre["ffn"] == "gated" and pre["ffn_in"] == (2 * pre["ffn_out"][1], 128)


def test_the_masks_picture_is_the_models_padding_mask_and_a_causal_one() -> None:
    d = make_pictures().masks_data()
    tokens, full, causal = d["tokens"], d["bidirectional"], d["causal"]
    S = len(tokens)
    assert tokens[:3] == ["[CLS]", "i", "drank"] and "[MASK]" in tokens and tokens[-2:] == ["[PAD]", "[PAD]"]
    assert d["extended_shape"] == (2, 1, 1, S)
    real = [t != "[PAD]" for t in tokens]
    assert all(full[i] == real for i in range(S))  # every query reads every real key, no padding key
    assert all(causal[i][j] == (real[j] and j <= i) for i in range(S) for j in range(S))


def test_the_fine_tuning_picture_draws_the_real_tokens_labels_and_span() -> None:
    d = make_pictures().fine_tuning_data()
    assert d["classification"][0] == "[CLS]" and d["classification"][-1] == "[SEP]" and len(d["classification"]) == 9
    # page 8's printout of the same tagged words
    assert d["tagging"]["tokens"] == ["[CLS]", "angela", "mer", "##kel", "visited", "wolf", "##sburg", "yesterday", "[SEP]"]
    assert d["tagging"]["labels"] == [-100, 1, 2, -100, 0, 3, -100, 0, -100]
    qa = d["qa"]
    first, last = qa["span"]
    assert qa["tokens"][first:last + 1] == ["the", "10th", "and", "11th", "centuries"]
    assert qa["types"][first] == 1 and qa["types"][:qa["types"].index(1)].count(0) == qa["tokens"].index("[SEP]") + 1


def test_the_family_picture_reads_each_members_spec() -> None:
    from bertforge import BertConfig

    d = make_pictures().family_data()
    assert list(d) == ["bert", "roberta", "albert", "distilbert", "deberta-v2", "modernbert"]
    for name, row in d.items():
        spec = BertConfig.preset(f"{name}-tiny").spec
        assert row["norm"] == spec.norm and row["positions"] == spec.positions and row["ffn"] == spec.ffn
        assert row["token types"] == str(spec.type_vocab_size) and row["pooler"] == str(spec.pooler)
    assert d["albert"]["embedding_size"] == "64" and d["deberta-v2"]["relative"] == "p2c+c2p"
    assert d["modernbert"]["rotary: window"] == "128, global" and d["bert"]["rotary: window"] == "-"


def test_the_pretraining_input_picture_draws_real_instances_masked_by_the_collator() -> None:
    d = make_pictures().pretraining_input_data()
    assert [pair["nsp"] for pair in d["pairs"]] == ["IsNext (0)", "NotNext (1)"]
    for pair in d["pairs"]:
        tokens, masked, targets, types = pair["tokens"], pair["masked"], pair["targets"], pair["types"]
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
        assert types == [0] * (tokens.index("[SEP]") + 1) + [1] * (len(tokens) - tokens.index("[SEP]") - 1)
        scored = [i for i, t in enumerate(targets) if t is not None]
        assert scored and all(targets[i] == tokens[i] for i in scored)  # the target is the original token
        assert all(masked[i] == tokens[i] for i in range(len(tokens)) if i not in scored)  # only scored ones change
        assert all(tokens[i] not in ("[CLS]", "[SEP]") for i in scored)
    assert " ".join(d["pairs"][0]["tokens"]).startswith("[CLS] it lives in a ken ##nel .")  # page 7's IsNext pair


def test_the_drawings_fit_the_sites_column(tmp_path: Path) -> None:
    """The pictures are at most 800 px wide (10 in at DPI 80), so their 11 pt text stays legible on the page (all but
    pretraining_curves, which needs the demo's pretraining run)."""
    import matplotlib.image

    pictures = make_pictures()
    for name in sorted(set(pictures.PICTURES) - {"pretraining_curves"}):
        png = pictures.PICTURES[name](tmp_path)
        height, width = matplotlib.image.imread(png).shape[:2]
        assert width <= 800 and png.stat().st_size < 150_000, (name, width, height)


def test_every_probe_has_a_kind_that_holds_its_answer() -> None:
    kinds = make_pictures().probe_kinds()
    assert len(kinds) == 12
    assert all(answer in kind and len(kind) > 3 for _, answer, kind in kinds)


@pytest.mark.slow
def test_make_pictures_writes_every_picture(tmp_path: Path) -> None:
    made = make_pictures().main(["--out", str(tmp_path), "--steps", "20"])
    assert sorted(p.name for p in made) == sorted(f"{n}.png" for n in make_pictures().PICTURES)
    assert all(p.stat().st_size < 150_000 for p in made)


@pytest.mark.slow
def test_head_vs_full_runs_both_ways_on_its_stand_in_data(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("head_vs_full", DOCS / "exercises" / "head_vs_full.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    head, full = module.main(["--data", str(tmp_path / "absent"), "--train-rows", "64", "--dev-rows", "32",
                              "--epochs", "1"])
    assert head["run"] == "head only" and full["run"] == "full fine-tuning"
    assert head["trained"] < full["trained"] == full["total"] == head["total"]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in (head, full))


def test_the_learn_extra_brings_every_package_the_course_imports() -> None:
    """`pip install -e '.[learn]'` (docs/learn/index.md) is all a learner needs: each module a page's Python imports
    is the standard library's, bertforge's, or a distribution of the core install or of the `learn` extra (or one
    they pull in: `safetensors`, torch's own). The course names the extra as its install."""
    import ast
    import importlib.metadata
    import sys
    import tomllib

    project = tomllib.loads((DOCS.parent / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    name = lambda req: re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")  # noqa: E731
    allowed = {name(r) for r in project["dependencies"] + project["optional-dependencies"]["learn"]}
    distributions = importlib.metadata.packages_distributions()
    needed: dict[str, set[str]] = {}
    for page in PAGES:
        for _, code, _ in python_blocks(page.read_text(encoding="utf-8")):
            for node in ast.walk(ast.parse(code)):
                modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                           else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                for module in modules:
                    top = module.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "bertforge":
                        needed.setdefault(top, set()).add(page.name)
    assert needed, "the pages import nothing outside the standard library and bertforge?"
    for top, pages in needed.items():
        owners = {d.lower().replace("_", "-") for d in distributions.get(top, [])}
        assert owners & allowed, f"{top} (imported by {sorted(pages)}) comes from {owners}, not the core or the learn extra"
    index = (DOCS / "learn" / "index.md").read_text(encoding="utf-8")
    assert "pip install -e '.[learn]'" in index and "'.[test]'" not in index
    for page in PAGES:
        assert "find_spec" not in page.read_text(encoding="utf-8"), page.name  # the files are found by their package's list
