"""The documentation site (`mkdocs.yml`, `docs/`) builds with `--strict`, and the code of its pages runs.

- `mkdocs build --strict`: a broken link or anchor, a page missing from the navigation, a
  docstring the API reference cannot parse or an unresolved cross-reference fails the build.
- Every `bash`/`sh` and `python` block of the README and of the pages under `docs/` (the API
  reference holds no code) runs, from the repository root, unless the line before it says why not:
  `<!-- not run: REASON -->` (a GPU, minutes of training, a cluster). A block in another language
  must be marked too, except data (`yaml` and `json` blocks are parsed; `text` is shown as is).
- A block that trains for minutes, or needs GPUs or hub data, runs on the CPU at tiny scale when the
  line before it says `<!-- run at tiny scale: ARGS -->` (or only `<!-- run at tiny scale -->`: as
  written). ARGS are groups separated by ` | `: a group `KEY: ARGS` applies to the commands that
  contain KEY (a config's name, a program), a group without a key to the `main.py fit` commands.
  The arguments go after the last `--config FILE` of a `main.py` or `python -m examples.` command
  (the line's own later arguments still win) and at the end of any other command (argparse: the
  last value wins). The tiny blocks of a page run in order in one scratch directory (the
  repository's `main.py`, `configs/`, `examples/` and `scripts/` linked in), so a later block finds
  what an earlier one wrote (a checkpoint, an exported model): a step another command needs is a
  command of the page, never a fake.
- The only blocks not run: the full install, the full main job, `mkdocs serve`, the whole test
  suite, and excerpts of a file that a test checks line for line against the file (`an excerpt of
  FILE, line for line` in the reason: checked here) while the next block runs the file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO_ROOT, subprocess_env

RUN = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python"}
DATA = {"yaml", "json", "text"}
NOT_RUN = re.compile(r"^<!-- not run: (\S.*\S) -->$")
TINY = re.compile(r"^<!-- run at tiny scale(?:: (\S.*\S))? -->$")
LINKED = ("main.py", "configs", "examples", "scripts")  # what a tiny block's scratch directory links to
EXCERPT = re.compile(r"an excerpt of (\S+), line for line")
FENCE = re.compile(r"^(\s*)(`{3,})([\w+-]*)\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    not_run: str | None  # the reason given on the line before, if any
    tiny: str | None = None  # the arguments that shrink its `main.py fit` commands, if any

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO_ROOT)}:{self.line}"


def pages() -> list[Path]:
    docs = REPO_ROOT / "docs"
    return [REPO_ROOT / "README.md", *sorted(p for p in docs.rglob("*.md") if "reference" not in p.relative_to(docs).parts)]


def blocks(page: Path, text: str | None = None) -> list[Block]:
    """The fenced code blocks of a page, each with the reason it is not run (None: it runs)."""
    lines = (page.read_text() if text is None else text).split("\n")
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, language = m.groups()
        end = next(j for j in range(i + 1, len(lines)) if re.match(rf"^{indent}{fence}\s*$", lines[j]))
        before = next((lines[k].strip() for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        reason, tiny = NOT_RUN.match(before), TINY.match(before)
        code = "\n".join(line[len(indent):] for line in lines[i + 1:end])
        found.append(Block(page, i + 1, language or "", code + "\n", reason.group(1) if reason else None,
                           (tiny.group(1) or "") if tiny else None))
        i = end + 1
    return found


ALL = [b for p in pages() for b in blocks(p)]
RUNNABLE = [b for b in ALL if b.not_run is None and b.language in RUN]


def test_site_builds_strict(tmp_path):
    """The whole site, API reference included, with every warning an error."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO_ROOT, env={**subprocess_env(), "NO_MKDOCS_2_WARNING": "1"},
                          capture_output=True, text=True, timeout=300)
    assert "No module named mkdocs" not in done.stderr, "the docs tools are missing: pip install -e '.[docs]'"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    site = tmp_path / "site"
    assert (site / "reference" / "losses" / "index.html").is_file()
    assert "lit_rlhf.losses.dpo_loss" in (site / "reference" / "losses" / "index.html").read_text()
    assert (site / "experiments" / "dro_single_trajectory" / "results" / "main" / "frontier.png").is_file()
    assert time.monotonic() - started < 120


def test_every_page_is_in_the_navigation():
    """`mkdocs build --strict` fails on a page left out of `nav`; this names it without building."""
    config = yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))

    def entries(nav):
        for item in nav:
            if isinstance(item, str):
                yield item
            else:
                for value in item.values():
                    yield from ([value] if isinstance(value, str) else entries(value))

    listed = set(entries(config["nav"]))
    docs = REPO_ROOT / "docs"
    assert {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")} <= listed


def test_every_block_runs_or_says_why_not():
    unmarked = [f"{b.name} ({b.language or 'no language'})" for b in ALL
                if b.not_run is None and b.language not in RUN and b.language not in DATA]
    assert not unmarked, "blocks that neither run nor say why not (<!-- not run: REASON -->): " + ", ".join(unmarked)
    assert len(RUNNABLE) >= 8  # the pages keep runnable examples


def test_the_block_reader_sees_markers_and_languages(tmp_path):
    page = tmp_path / "page.md"
    text = ("Intro.\n\n<!-- not run: needs a GPU -->\n```bash\nnvidia-smi\n```\n\n```python\nprint(1)\n```\n\n"
            "- a list item\n\n  ```console\n  $ ls\n  ```\n")
    found = blocks(page, text)
    assert [(b.line, b.language, b.not_run) for b in found] == [(4, "bash", "needs a GPU"), (8, "python", None),
                                                              (14, "console", None)]
    assert found[2].code == "$ ls\n"


@pytest.mark.parametrize("block", [b for b in ALL if b.not_run is None and b.language in ("yaml", "json")],
                         ids=lambda b: b.name)
def test_data_block_parses(block):
    (yaml.safe_load if block.language == "yaml" else json.loads)(block.code)


KEYED = re.compile(r"^([^\s-][^\s:]*): (.*)$")  # `KEY: ARGS`
END = re.compile(r"\s+(#|>|\||&&|;)")  # where a command's arguments end on its line


def at_tiny_scale(code: str, args: str) -> str:
    """`code` with each group of `args` added to the commands it applies to (the module docstring)."""
    groups = []
    for group in filter(None, (g.strip() for g in args.split(" | "))):
        keyed = KEYED.match(group)
        groups.append(keyed.groups() if keyed else ("main.py fit", group))
    lines = code.replace("\\\n", " ").split("\n")  # a command continued with `\` is one line
    for i, line in enumerate(lines):
        extra = " ".join(args for key, args in groups if key in line)
        if not extra:
            continue
        if "--config" in line and re.search(r"main\.py|-m examples\.", line):
            lines[i] = re.sub(r"(.*--config \S+)", lambda m: f"{m.group(1)} {extra}", line, count=1)
        else:
            key = next(key for key, _ in groups if key in line)
            end = END.search(line, line.index(key) + len(key))
            cut = end.start() if end else len(line)
            lines[i] = f"{line[:cut]} {extra}{line[cut:]}"
    return "\n".join(lines)


def test_tiny_scale_adds_the_arguments_after_the_last_config():
    code = "until python main.py fit --config a.yaml --config b.yaml --ckpt_path last; do\n  echo\ndone\n"
    assert at_tiny_scale(code, "--x=1").split("\n")[0] == \
        "until python main.py fit --config a.yaml --config b.yaml --x=1 --ckpt_path last; do"


def test_tiny_scale_groups_apply_to_the_commands_that_name_their_key():
    code = ("python main.py fit --config configs/r.yaml --m x   # once\n"
            "python main.py fit --config configs/p.yaml\n"
            "python -m apps.x --n 8 \\\n    --k 1 4 > out.txt\n")
    assert at_tiny_scale(code, "--a=1 | r.yaml: --b=2 | apps.x: --n 2 --k 1").split("\n") == [
        "python main.py fit --config configs/r.yaml --a=1 --b=2 --m x   # once",
        "python main.py fit --config configs/p.yaml --a=1",
        "python -m apps.x --n 8      --k 1 4 --n 2 --k 1 > out.txt", ""]


def test_an_excerpt_is_its_file_line_for_line():
    """A block not run because it is `an excerpt of FILE, line for line` is a run of FILE's lines."""
    excerpts = [b for b in ALL if b.not_run and EXCERPT.search(b.not_run)]
    for block in excerpts:
        path = REPO_ROOT / EXCERPT.search(block.not_run).group(1)
        assert block.code.strip() in path.read_text(), f"{block.name} is not {path.name} line for line"
    assert excerpts


SCRATCH: dict[Path, Path] = {}  # page -> the scratch directory of its tiny blocks


@pytest.mark.parametrize("block", [pytest.param(b, marks=pytest.mark.xdist_group(b.page.name) if b.tiny is not None else ())
                                   for b in RUNNABLE], ids=lambda b: b.name)
def test_block_runs(block, tmp_path_factory):
    env = {**subprocess_env(), "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    code, cwd = block.code, REPO_ROOT
    if block.tiny is not None:
        code = at_tiny_scale(code, block.tiny)
        if block.page not in SCRATCH:
            SCRATCH[block.page] = tmp_path_factory.mktemp(block.page.stem)
            for name in LINKED:
                (SCRATCH[block.page] / name).symlink_to(REPO_ROOT / name)
        cwd = SCRATCH[block.page]
    command = ["bash", "-euo", "pipefail", "-c", code] if RUN[block.language] == "bash" else \
        [sys.executable, "-c", code]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{block.name} failed:\n{code}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def test_the_judge_file_shown_is_the_shipped_one():
    shown = [b for b in blocks(REPO_ROOT / "docs/guides/evaluation.md") if b.language == "yaml"]
    assert [yaml.safe_load(b.code) for b in shown] == [yaml.safe_load((REPO_ROOT / "examples/judge.yaml").read_text())]
