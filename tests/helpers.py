"""Test-only helpers importable by subprocesses started from the repository root."""

from __future__ import annotations

import atexit
import json
import os
import re
from pathlib import Path

import yaml
from lightning import Callback

REPO_ROOT = Path(__file__).resolve().parent.parent


class StepMarker(Callback):
    """Writes {"global_step": N} to `path` after every training batch (to follow a subprocess)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        tmp = f"{self.path}.tmp"
        Path(tmp).write_text(json.dumps({"global_step": trainer.global_step}))
        os.replace(tmp, self.path)


def read_marker(path: Path) -> int:
    try:
        return json.loads(Path(path).read_text())["global_step"]
    except (FileNotFoundError, json.JSONDecodeError):
        return -1


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    return env


class SignalOnce(Callback):
    """Sends `signal` (default SIGTERM) to this process in the backward pass of optimizer step
    `step` + 1 (inside a training step), once: it leaves `marker` behind and does nothing in a
    later run that finds it (so a resubmitted command with the same config is not signalled)."""

    def __init__(self, marker: str, step: int, signal: int = 15) -> None:
        self.marker, self.step, self.signal = marker, step, signal

    def on_after_backward(self, trainer, pl_module) -> None:
        if trainer.global_step == self.step and not Path(self.marker).exists():
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), self.signal)


class SignalAfterFit(Callback):
    """Sends SIGTERM to this process after the fit's last step, twice: in its `teardown` (after the
    module's `on_fit_end` logged `run stopped:`, before the module's teardown and the loggers' final
    flush) and as the process exits (an `atexit` function, after the CLI returned)."""

    def teardown(self, trainer, pl_module, stage) -> None:
        if stage == "fit":
            atexit.register(os.kill, os.getpid(), 15)
            os.kill(os.getpid(), 15)


class SignalAtInit(Callback):
    """Sends SIGTERM to this process when it is built (while the CLI instantiates the config)."""

    def __init__(self) -> None:
        os.kill(os.getpid(), 15)


def decimals_not_in_files(section: str, tables: list[Path], jsons: list[Path]) -> list[str]:
    """The decimal numbers of a README `section` that no result file carries, as printed in one of
    `tables` or as a float of one of `jsons` at 2 or 3 decimals (signs ignored)."""
    known = {m.lstrip("+-") for path in tables for m in re.findall(r"[+-]?\d+\.\d+", path.read_text())}

    def floats(node):
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            for item in node:
                yield from floats(item)
        elif isinstance(node, float):
            yield node

    for path in jsons:
        for x in floats(json.loads(path.read_text())):
            known |= {f"{abs(x):.3f}", f"{abs(x):.2f}", f"{abs(x):g}"}
    return [n for n in re.findall(r"(?<![\w.])[+-]?\d+\.\d+", section) if n.lstrip("+-") not in known]
