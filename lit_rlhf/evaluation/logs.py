"""A run's logged scalars read back from its TensorBoard event files (for reports and experiments)."""

from __future__ import annotations

from pathlib import Path


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of every scalar in the event files of `run_dir` ({} when it does not exist)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not Path(run_dir).is_dir():
        return {}
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
