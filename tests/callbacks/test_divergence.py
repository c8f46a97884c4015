"""DivergenceMonitor: the window's change by hand, the warning when the training reward rises
while the monitor falls (logged once per onset, counted), fresh steps only, and its state."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from callbacks import DivergenceMonitor
from callbacks.divergence import window_change


def test_window_change_by_hand():
    assert window_change([0.0, 1.0, 2.0]) == pytest.approx(2.0)          # a line: its rise
    assert window_change([1.0, 0.0, 1.0, 0.0]) == pytest.approx(-0.6)    # slope -0.2 over 3 steps
    assert window_change([5.0]) == 0.0


def test_warns_once_per_onset_and_counts(caplog):
    monitor = DivergenceMonitor(window=3, min_fall=0.15)
    with caplog.at_level(logging.WARNING):
        assert monitor.observe(0.0, 1.0) == {}
        assert monitor.observe(0.1, 1.0) == {}
        out = monitor.observe(0.2, 1.0)           # train up, monitor flat: fine
        assert out["train/divergence/diverging"] == 0.0 and out["train/divergence/train_change"] == pytest.approx(0.2)
        assert monitor.observe(0.3, 0.9)["train/divergence/diverging"] == 0.0   # monitor 1, 1, 0.9: change -0.1, not below -0.15
        out = monitor.observe(0.4, 0.7)           # window (0.2,1.0),(0.3,0.9),(0.4,0.7): monitor change -0.3
        assert out["train/divergence/diverging"] == 1.0 and out["train/divergence/monitor_change"] == pytest.approx(-0.3)
        monitor.observe(0.5, 0.5)                 # still diverging: no second warning
        assert monitor.warnings == 1
        monitor.observe(0.5, 0.9)
        monitor.observe(0.5, 1.2)                 # the monitor recovers
        assert not monitor.diverging
        monitor.observe(0.9, 0.8)
        monitor.observe(1.2, 0.4)                 # diverges again
    assert monitor.warnings == 2 and monitor.diverging
    assert caplog.text.count("monitor diverge (warning") == 2
    restored = DivergenceMonitor(window=3, min_fall=0.15)
    restored.load_state_dict(monitor.state_dict())
    assert restored.points == monitor.points and restored.warnings == 2 and restored.diverging


def test_reads_fresh_logged_steps_only():
    monitor = DivergenceMonitor(train="train/rewards/rubric", monitor="train/rewards/gold", window=2)
    trainer = SimpleNamespace(callback_metrics={}, global_step=1, is_global_zero=True, loggers=[])
    monitor.on_train_batch_end(trainer, None, None, None, 0)
    assert monitor.points == []                                   # nothing logged yet
    trainer.callback_metrics.update({"train/rewards/rubric": torch.tensor(0.5), "train/rewards/gold": torch.tensor(0.4),
                                     "train/objective/episodes": torch.tensor(8.0)})
    monitor.on_train_batch_end(trainer, None, None, None, 0)
    monitor.on_train_batch_end(trainer, None, None, None, 1)      # the same logged step again: skipped
    assert monitor.points == [(0.5, pytest.approx(0.4))]
    with pytest.raises(ValueError, match="window"):
        DivergenceMonitor(window=1)
