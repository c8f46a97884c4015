"""The distillation-vs-GRPO experiment (experiments/distill_vs_grpo): the driver on the tiny model
for one step per arm, its reading of those files, and the committed reading against its files."""

from __future__ import annotations

import json

import pytest
import torch

from experiments.distill_vs_grpo import reading, run
from tests.helpers import REPO_ROOT

RESULTS = REPO_ROOT / "experiments" / "distill_vs_grpo" / "results"


def test_driver_and_reading_on_the_tiny_model(tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "results"
    run.main(["--out", str(out), "--logs", str(tmp_path / "logs"), "--model", "tiny-random-llama",
              "--teacher", "tiny-random-llama", "--seeds", "1", "--selection-seed", "0", "--lrs", "1e-5", "3e-5", "--distill-lr", "0",
              "--steps", "2", "--select-steps", "1", "--every", "1", "--eval-split", "test[:6]", "--threads", "1", "--",
              "--model.init_args.max_new_tokens=4", "--data.init_args.max_prompt_length=256",
              "--data.init_args.val_split=validation[:5]"])
    teacher = json.loads((out / "teacher.json").read_text())
    assert len(teacher["test"]["correct"]) == 6 and len(teacher["val"]["correct"]) == 5
    start = json.loads((out / "start_test.json").read_text())["answers"]
    choice = json.loads((out / "select" / "choice.json").read_text())
    assert choice["lr"] in (1e-5, 3e-5) and choice["seed"] == 0 and choice["steps"] == 1
    for arm in ("grpo", "distill"):
        record = json.loads((out / "runs" / f"{arm}_s1.json").read_text())
        assert record["steps"] == 2 and sorted(record["checkpoints"], key=int) == ["0", "1", "2"]
        assert [c["samples"] for _, c in sorted(record["checkpoints"].items(), key=lambda kv: int(kv[0]))] == [0, 24, 48]
        assert all(len(c["correct"]) == 6 for c in record["checkpoints"].values())
    grpo = json.loads((out / "runs" / "grpo_s1.json").read_text())
    distill = json.loads((out / "runs" / "distill_s1.json").read_text())
    assert grpo["checkpoints"]["0"]["answers"] == distill["checkpoints"]["0"]["answers"] == start["answers"]
    assert distill["lr"] == choice["lr"] and grpo["lr"] == run.SHIPPED_GRPO_LR
    result = reading.read(out, primary_step=1)
    assert result["seeds"] == [1] and result["primary"]["step"] == 1
    diffs = [d - g for d, g in zip(distill["checkpoints"]["1"]["correct"], grpo["checkpoints"]["1"]["correct"])]
    assert result["primary"]["difference"]["mean"] == pytest.approx(sum(diffs) / 6)
    assert result["primary"]["verdict"] in reading.VERDICTS.values()
    assert "distill - grpo" in reading.render(result)


@pytest.mark.parametrize("directory, mark, decision", [
    ("results", reading.MARK, True),  # the reported runs (8 steps)
    ("results_16steps", "reading:distill_vs_grpo_16steps", False),  # the supplementary 16-step runs
])
def test_committed_reading_comes_from_the_files(directory, mark, decision):
    results = RESULTS.parent / directory
    if not (results / "reading.json").is_file():
        pytest.skip(f"no reading of {directory} is committed")
    result = reading.read(results)
    saved = json.loads((results / "reading.json").read_text())
    assert saved == json.loads(json.dumps(result))
    readme = (REPO_ROOT / "experiments" / "distill_vs_grpo" / "README.md").read_text()
    assert reading.block(readme, mark) == reading.render(result, decision=decision)


def test_one_arm_alone_and_the_reading_with_no_selection(tmp_path):
    """`--only`: the parts run apart (in parallel), distill at grpo's lr without a selection."""
    torch.set_num_threads(1)
    out = tmp_path / "results"
    common = ["--out", str(out), "--logs", str(tmp_path / "logs"), "--model", "tiny-random-llama", "--teacher",
              "tiny-random-llama", "--steps", "1", "--every", "1", "--eval-split", "test[:4]", "--threads", "1", "--",
              "--model.init_args.max_new_tokens=4", "--data.init_args.max_prompt_length=256",
              "--data.init_args.val_split=validation[:3]"]
    run.main(["--only", "policies"] + common)
    for arm in ("grpo", "distill"):
        run.main(["--only", arm, "--seed", "5"] + common)
    assert not (out / "select").exists()
    result = reading.read(out, primary_step=1)
    assert result["selection"] is None and result["arms"]["distill"]["lr"] == run.SHIPPED_GRPO_LR
    assert "no selection run" in reading.render(result) and "word for word" in reading.render(result)
