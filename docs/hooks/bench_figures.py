"""Publishes the benchmark figures kept beside their raw results (`bench/results/**/*.png`) with the site, at the
same path (`bench/results/...`), so a benchmark page shows the figure its command wrote rather than a copy of it.
MkDocs runs `on_files` as a hook (`mkdocs.yml`: `hooks:`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path in sorted((ROOT / "bench" / "results").rglob("*.png")):
        files.append(File(str(path.relative_to(ROOT)), src_dir=str(ROOT), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files
