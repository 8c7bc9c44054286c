"""Renders the pages' display formulas offline: a paragraph that is a `$$ ... $$` block (outside code) becomes
MathML, which browsers draw natively (no script, no CDN). The LaTeX is converted by `latex2mathml` (the `test`
extra) before Markdown sees the page: each formula is swapped for a placeholder word in `on_page_markdown` (so
Markdown cannot read `_` or `*` in it as emphasis) and the placeholder's paragraph for the MathML in
`on_page_content`. MkDocs runs both as a hook (`mkdocs.yml`: `hooks:`). Only display formulas: a `$` inside a
sentence stays a dollar."""

from __future__ import annotations

import re
from typing import Any

DISPLAY = re.compile(r"^\$\$\n?(.+?)\n?\$\$$", re.S | re.M)
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.S | re.M)
PLACEHOLDER = "bertforgemathsformula{}"


def to_mathml(latex: str) -> str:
    """One display formula as a MathML <math> element."""
    from latex2mathml.converter import convert

    return convert(latex.strip(), display="block")


def formulas(markdown: str) -> tuple[str, list[str]]:
    """The page with each display formula outside a fence swapped for a placeholder, and the formulas' MathML."""
    found: list[str] = []

    def swap(match: re.Match[str]) -> str:
        found.append(to_mathml(match.group(1)))
        return PLACEHOLDER.format(len(found) - 1)

    parts, last = [], 0
    for fence in FENCE.finditer(markdown):
        parts.append(DISPLAY.sub(swap, markdown[last : fence.start()]))
        parts.append(fence.group())
        last = fence.end()
    parts.append(DISPLAY.sub(swap, markdown[last:]))
    return "".join(parts), found


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    text, found = formulas(markdown)
    page.maths = found
    return text


def on_page_content(html: str, page: Any, **_: Any) -> str:
    for i, mathml in enumerate(getattr(page, "maths", [])):
        placeholder = PLACEHOLDER.format(i)
        html = html.replace(f"<p>{placeholder}</p>", f'<div class="maths">{mathml}</div>').replace(placeholder, mathml)
    return html
