"""A quiet console for the CLI: the progress bar and the project's own lines, nothing else.

`configure(verbose=False)` silences, at their source and by exact message, lines that carry no
information for a run (`LOG_FILTERS`, `WARNING_FILTERS`: Lightning's tips and notices,
DeepSpeed's "Setting accelerator to CPU", the reward export's note on `reward_bias`) and the
progress bars of `transformers`, `datasets` and `huggingface_hub`; everything else is kept, and
the project's loggers (`lit_rlhf.*`, `callbacks.*`) print their INFO lines. `verbose=True`
(`--verbose`, `LIT_RLHF_VERBOSE=1`) filters nothing. Either way every log line and, at a
terminal, every Python warning is written above the progress bar (`tqdm.write`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings

VERBOSE_ENV = "LIT_RLHF_VERBOSE"
VERBOSE_FLAG = "--verbose"

# logger name -> regular expressions of messages dropped from it
LOG_FILTERS: dict[str, tuple[str, ...]] = {
    "lightning.pytorch.utilities.rank_zero": (
        r"^💡 Tip: For seamless cloud logging",
        r"^(GPU|TPU|HPU) available: ",
        r"^Loading `train_dataloader` to estimate number of stepping batches",
    ),
    "lightning.fabric.utilities.seed": (r"^Seed set to \d+$",),
    "lightning.pytorch.trainer.connectors.checkpoint_connector": (r"^`weights_only` was not set",),
    "DeepSpeed": (r"^Setting accelerator to CPU\.",),
    "lit_rlhf.modules.reward": (r"^exporting a reward model whose final norm has no bias",),
}

# (message regex, category) of Python warnings ignored
WARNING_FILTERS: tuple[tuple[str, type[Warning]], ...] = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", Warning),
    (r"Trying to infer the `batch_size` from an ambiguous collection", Warning),
)

PROGRESS_BAR_ENV = {
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}

PROJECT_LOGGERS = ("lit_rlhf", "callbacks")


def verbose_requested(argv: list[str] | None = None) -> bool:
    """True when `LIT_RLHF_VERBOSE` is set to a true value or `--verbose` is in `argv`."""
    if (os.environ.get(VERBOSE_ENV) or "").strip().lower() in {"1", "true", "yes", "on"}:
        return True
    return VERBOSE_FLAG in (argv or [])


class DropMessages(logging.Filter):
    """Drops the records of one logger whose message matches one of `patterns`."""

    def __init__(self, patterns: tuple[str, ...]) -> None:
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.search(message) for p in self.patterns)


class AboveTheBar(logging.StreamHandler):
    """Writes each record to the current `sys.stderr` on a line of its own: `tqdm.write` clears an
    open progress bar, writes the line and draws the bar again below it."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            write_above_the_bar(self.format(record))
        except Exception:  # noqa: BLE001 - logging's own policy: report, never raise
            self.handleError(record)


def write_above_the_bar(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    """`warnings.showwarning` that writes above the progress bar."""
    write_above_the_bar(warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n"))


def configure(verbose: bool = False) -> None:
    """Install the filters (idempotent), a handler for the project's loggers, and log lines and
    warnings written above the progress bar."""
    _project_handler()
    lightning = logging.getLogger("lightning.pytorch")
    for handler in [h for h in lightning.handlers if type(h) is logging.StreamHandler]:
        lightning.removeHandler(handler)
        lightning.addHandler(above := AboveTheBar())
        above.setLevel(handler.level)
        above.setFormatter(handler.formatter)
    if sys.stderr.isatty():  # a terminal shows the bar's line; elsewhere leave warnings to whoever records them
        warnings.showwarning = show_warning
    if verbose:
        return
    for name, patterns in LOG_FILTERS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMessages) for f in logger.filters):
            logger.addFilter(DropMessages(patterns))
    for message, category in WARNING_FILTERS:
        warnings.filterwarnings("ignore", message=message, category=category)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _project_handler() -> None:
    """INFO lines of `lit_rlhf.*` and `callbacks.*` on stderr, once (like Lightning's own)."""
    for name in PROJECT_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
        if not any(getattr(h, "_lit_rlhf", False) for h in logger.handlers):
            handler = AboveTheBar()
            handler.setFormatter(logging.Formatter("%(message)s"))
            handler._lit_rlhf = True  # type: ignore[attr-defined]
            logger.addHandler(handler)
            logger.propagate = False


def prepare_process(argv: list[str]) -> list[str]:
    """What `main.py` does before importing Lightning, `transformers` or `datasets` (they read
    the environment at import): the verbose switch (`--verbose` is taken out of `argv` and
    recorded in `LIT_RLHF_VERBOSE`, which DDP workers inherit), progress bars, telemetry off and
    the offline decision (`lit_rlhf.hub.prepare_environment`). Returns the remaining arguments."""
    from lit_rlhf import hub

    if VERBOSE_FLAG in argv:
        os.environ[VERBOSE_ENV] = "1"
    for key, value in () if verbose_requested() else PROGRESS_BAR_ENV.items():
        os.environ.setdefault(key, value)
    hub.prepare_environment()
    return [a for a in argv if a != VERBOSE_FLAG]
