"""The console's callbacks every `python main.py` run gets unless its config lists its own.

`main.py` hands `default_callbacks` to the CLI (`lit_rlhf.cli.main(..., default_callbacks=...)`);
`lit_rlhf` itself never imports this package and adds only its own default, the checkpoint on
SIGTERM (`lit_rlhf.preemption`).
"""

from __future__ import annotations

from typing import Any

from lightning import Callback
from lightning.pytorch.callbacks import ProgressBar

from callbacks.progress import CompactProgressBar
from callbacks.run_health import RunHealthCallback


def default_callbacks(trainer_config: dict[str, Any], listed: list[Callback] = ()) -> list[Callback]:
    """`CompactProgressBar` (when the progress bar is enabled and none is listed) and
    `RunHealthCallback` (the dead-run warnings, unless listed)."""
    extra: list[Callback] = []
    if trainer_config.get("enable_progress_bar", True) is not False and not any(isinstance(c, ProgressBar) for c in listed):
        extra.append(CompactProgressBar())
    if not any(isinstance(c, RunHealthCallback) for c in listed):
        extra.append(RunHealthCallback())
    return extra
