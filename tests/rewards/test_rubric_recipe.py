"""configs/quickstart/grpo_rubric.yaml through `python main.py fit` on the tiny model: the rubric
reward trains GRPO, the weight-0 gold is logged beside it, and DivergenceMonitor logs its window."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import yaml

from lit_rlhf import models

REPO = Path(__file__).resolve().parents[2]


def test_grpo_with_the_rubric_reward_through_main_py(tmp_path):
    config = yaml.safe_load((REPO / "configs" / "quickstart" / "grpo_rubric.yaml").read_text())
    model = config["model"]["init_args"]
    model.update(model=models.TINY_RANDOM_SMOLLM2, total_episodes=16, max_new_tokens=6,
                 export_dir=str(tmp_path / "policy"), log_completions_every_n_steps=0)
    rubric = model["reward_fns"][0]["init_args"]["judge"]["init_args"]
    rubric["scorer"]["init_args"]["model_name"] = models.TINY_RANDOM_SMOLLM2
    assert model["reward_weights"] == [1.0, 0.0]  # the recipe: the gold is a monitor, never optimised
    config["data"]["init_args"]["max_prompt_length"] = 512  # the tiny tokenizer spells the posts longer
    callbacks = config["trainer"]["callbacks"]
    callbacks[0]["init_args"]["dirpath"] = str(tmp_path / "checkpoints")
    callbacks[1]["init_args"]["window"] = 2
    config["trainer"]["logger"] = {"class_path": "lightning.pytorch.loggers.CSVLogger",
                                   "init_args": {"save_dir": str(tmp_path), "name": "run", "version": ""}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "main.py", "fit", "--config", str(path), "--trainer.enable_progress_bar=false"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [r for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv")) if r.get("train/rewards/rubric")]
    assert len(rows) == 2  # 16 episodes = 2 rollouts of 2 prompts x 4 answers
    for row in rows:
        assert 0.0 <= float(row["train/rewards/rubric"]) <= 1.0
        assert 0.0 <= float(row["train/rewards/keyfact_recall"]) <= 1.0
    window = [r for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv")) if r.get("train/divergence/train_change")]
    assert len(window) == 1 and window[0]["train/divergence/diverging"] in ("0.0", "1.0")
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file() and (tmp_path / "policy").is_dir()
