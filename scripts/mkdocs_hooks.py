"""MkDocs hooks of the documentation site (`mkdocs.yml`).

The replications' and the benchmarks' own pages (`experiments/README.md`, `benchmarks/*.md`) and
the committed figures they show live beside their code, outside `docs/`. They join the site from
where they are, under the same relative paths, so their image links resolve and nothing is copied
(a copy would drift from the files the tests check).

The footer shows the package's version (`lit_rlhf.__version__`, read from its file, not imported),
and `HidePrivateBases` (a griffe extension named in mkdocs.yml) keeps private helper classes such as
`_SFTExamples` out of the bases the API reference lists.
"""

from __future__ import annotations

import re
from pathlib import Path

import griffe
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
# repository files published as they are: pages, and the figures those pages (and docs/) show
OUTSIDE_DOCS = ("experiments/README.md", "benchmarks/README.md", "benchmarks/RESULTS.md", "benchmarks/gpu/README.md")
FIGURES = ("experiments/**/*.png", "examples/results/**/*.png")


def on_files(files, config):
    for path in OUTSIDE_DOCS:
        files.append(File(path, src_dir=str(ROOT), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    for pattern in FIGURES:
        for figure in sorted(ROOT.glob(pattern)):
            files.append(File(figure.relative_to(ROOT).as_posix(), src_dir=str(ROOT), dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    return files


def version() -> str:
    return re.search(r'^__version__ = "([^"]+)"', (ROOT / "lit_rlhf" / "__init__.py").read_text(), re.M).group(1)


def on_config(config):
    config["copyright"] = f"lit_rlhf {version()}"
    return config


class HidePrivateBases(griffe.Extension):
    """Drops the bases whose name starts with `_` from every class of the API reference."""

    def on_class_instance(self, *, cls, **kwargs) -> None:
        cls.bases = [b for b in cls.bases if not str(b).split("[")[0].split(".")[-1].startswith("_")]
