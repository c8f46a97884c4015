"""The command-line tools: `python -m lit_rlhf.apps.<tool>` (compare policies, judge a policy, judge agreement,
pass@k, an lm-evaluation-harness task), each run through `run`."""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path
from typing import Any, Callable


def run(main: Callable[[], Any]) -> None:
    """Run a tool's `main` as `main.py` runs the CLI: the project's own errors (a bad data row, a
    missing model, ...) as one line `error: <message>` on stderr with exit code 2 instead of a
    traceback; `--verbose` (or LIT_RLHF_VERBOSE=1) shows the traceback."""
    from lit_rlhf import console
    from lit_rlhf.cli import report_errors

    verbose = console.verbose_requested(sys.argv[1:])
    sys.argv[1:] = [a for a in sys.argv[1:] if a != console.VERBOSE_FLAG]
    report_errors(main, verbose)


def run_record(started: datetime.datetime, argv: list[str] | None) -> dict[str, Any]:
    """When, how long, on what machine and with which command a result was measured."""
    return {"created": started.isoformat(timespec="seconds"),
            "seconds": round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(), 1),
            "machine": machine(), "command": [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]}


def write_results(directory: str, metrics: dict[str, Any], rows_file: str, rows: list[dict[str, Any]]) -> Path:
    """`metrics.json` and one JSON line per row in `rows_file` under `directory` (created)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    (out / rows_file).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out


def machine() -> dict[str, Any]:
    """Where and under what load a result was measured."""
    import os
    import platform

    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"platform": platform.platform(), "processor": platform.machine(), "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "load_average_1_5_15": [round(x, 2) for x in load],
            "torch": torch.__version__, "python": platform.python_version()}


def import_class(dotted: str) -> Any:
    """The class at a dotted path (`lit_rlhf.data.TLDRPromptDataModule`)."""
    import importlib

    module_name, _, class_name = dotted.rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)
