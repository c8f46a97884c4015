"""A warning when the training reward rises while a held-out monitor falls (over-optimisation).

The monitor is a second reward source scored on the same rollouts with weight 0 in
`reward_weights`: logged as `train/rewards/{name}`, never optimised (a second judge, a rubric,
a gold such as `KeyFactRecallReward`). Gao et al. (2023, "Scaling Laws for Reward Model
Overoptimization") show the gold falling while the proxy still climbs; this callback watches for
that pattern as it happens:

    model:
      init_args:
        reward_fns: [<the training reward>, <the monitor>]
        reward_weights: [1.0, 0.0]
    trainer:
      callbacks:
        - class_path: callbacks.DivergenceMonitor
          init_args: {train: train/rewards/rubric, monitor: train/rewards/keyfact_recall, window: 8}

After each training step it reads both values from `trainer.callback_metrics` (the step stats of
the online methods, present on the steps the logger writes: `log_every_n_steps`; a step is taken
once, recognised by a new `train/objective/episodes`). Over the last `window` steps it fits a
least-squares line to each and calls the change along it over the window (slope x (window - 1))
the rise. When the training reward's rise exceeds `min_rise` while the monitor's is below
`-min_fall`, the run is diverging: a warning is logged when this starts, `warnings` counts the
starts, and `train/divergence/diverging` (0/1), `train/divergence/train_change` and
`train/divergence/monitor_change` are logged at every full window. The state travels in
checkpoints.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from lightning import Callback, LightningModule, Trainer

from lit_rlhf.lightning_compat import callback_state_key

log = logging.getLogger(__name__)

FRESHNESS_KEY = "train/objective/episodes"


def window_change(values: Sequence[float]) -> float:
    """The change over a window along its least-squares line: slope x (len - 1); 0 for < 2 values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    sxx = sum((i - mean_x) ** 2 for i in range(n))
    slope = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values)) / sxx
    return slope * (n - 1)


class DivergenceMonitor(Callback):
    """Warns (logged, counted) when `train` rises while `monitor` falls over `window` steps.

    Args:
        train: the metric of the optimised reward (`train/rewards/<name>`, or
            `train/objective/scores` for the weighted sum).
        monitor: the held-out monitor's metric (`train/rewards/<name>` of a weight-0 source).
        window: the number of recent steps compared (>= 2).
        min_rise: how much the training reward must rise over the window.
        min_fall: how much the monitor must fall over the window.
    """

    def __init__(self, train: str = "train/objective/scores", monitor: str = "train/rewards/keyfact_recall",
                 window: int = 8, min_rise: float = 0.0, min_fall: float = 0.0) -> None:
        if window < 2:
            raise ValueError(f"DivergenceMonitor: window must be >= 2, got {window}")
        if train == monitor:
            raise ValueError(f"DivergenceMonitor: train and monitor are the same metric {train!r}")
        self.train, self.monitor, self.window = train, monitor, int(window)
        self.min_rise, self.min_fall = float(min_rise), float(min_fall)
        self.points: list[tuple[float, float]] = []  # (train, monitor) of the last `window` steps
        self.warnings = 0
        self.diverging = False
        self._last_marker: float | None = None

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        metrics = trainer.callback_metrics
        marker = metrics.get(FRESHNESS_KEY)
        if marker is None or self.train not in metrics or self.monitor not in metrics:
            return  # a step the logger does not write: no fresh stats
        marker = float(marker)
        if marker == self._last_marker:
            return
        self._last_marker = marker
        logged = self.observe(float(metrics[self.train]), float(metrics[self.monitor]), trainer.global_step)
        if logged and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(logged, step=trainer.global_step)

    def observe(self, train: float, monitor: float, step: int = 0) -> dict[str, float]:
        """Record one step's values; the metrics to log once the window is full (else {})."""
        self.points = (self.points + [(train, monitor)])[-self.window:]
        if len(self.points) < self.window:
            return {}
        train_change = window_change([t for t, _ in self.points])
        monitor_change = window_change([m for _, m in self.points])
        diverging = train_change > self.min_rise and monitor_change < -self.min_fall
        if diverging and not self.diverging:
            self.warnings += 1
            log.warning("step %d: %s rose by %.4g over the last %d steps while %s fell by %.4g: the training reward "
                        "and the held-out monitor diverge (warning %d)", step, self.train, train_change, self.window,
                        self.monitor, -monitor_change, self.warnings)
        self.diverging = diverging
        return {"train/divergence/diverging": float(diverging), "train/divergence/train_change": train_change,
                "train/divergence/monitor_change": monitor_change, "train/divergence/warnings": float(self.warnings)}

    @property
    def state_key(self) -> str:
        return callback_state_key(self, train=self.train, monitor=self.monitor)

    def state_dict(self) -> dict[str, Any]:
        return {"points": [list(p) for p in self.points], "warnings": self.warnings, "diverging": self.diverging,
                "last_marker": self._last_marker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.points = [tuple(p) for p in state_dict.get("points", [])]
        self.warnings = int(state_dict.get("warnings", 0))
        self.diverging = bool(state_dict.get("diverging", False))
        self._last_marker = state_dict.get("last_marker")
