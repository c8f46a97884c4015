"""The README's main job, shortened: the same quickstart configs and CLI calls on the tiny model.

`scripts/quickstart.sh` runs these three `main.py` calls on SmolLM2-135M-Instruct; here each runs
in a temporary working directory (the configs write under `outputs/quickstart`), with the tiny
model, two reward steps and two GRPO rollouts, and a judge on the tiny model instead of SmolLM2.
The report script must then find every number it prints.
"""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.helpers import REPO_ROOT, subprocess_env, write_config

CONFIGS = REPO_ROOT / "configs" / "quickstart"
TINY = "--model.init_args.model=tiny-random-llama"


def run(args, cwd):
    done = subprocess.run([sys.executable, str(REPO_ROOT / "main.py"), *args], cwd=cwd, env=subprocess_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def test_quickstart_pipeline_on_the_tiny_model(tmp_path):
    judge = yaml.safe_load((CONFIGS / "judge.yaml").read_text())
    callback = judge["trainer"]["callbacks+"][0]["init_args"]
    callback["judge"]["init_args"]["model_name"] = "tiny-random-llama"
    callback["num_prompts"] = 4
    callback["sampling"]["max_new_tokens"] = 8
    tiny_judge = write_config(tmp_path / "judge_tiny.yaml", judge)

    run(["fit", "--config", str(CONFIGS / "reward.yaml"), TINY, "--trainer.max_steps=2", "--trainer.val_check_interval=2",
         "--trainer.limit_val_batches=1"], tmp_path)
    out = tmp_path / "outputs" / "quickstart"
    assert (out / "reward_model" / "config.json").is_file()
    assert (out / "reward" / "checkpoints" / "last.ckpt").is_file()

    short = [TINY, "--model.init_args.total_episodes=16", "--model.init_args.max_new_tokens=8",
             "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1"]
    run(["validate", "--config", str(CONFIGS / "grpo.yaml"), "--trainer.logger.init_args.name=grpo_start", *short],
        tmp_path)
    run(["fit", "--config", str(CONFIGS / "grpo.yaml"), "--config", str(tiny_judge), *short], tmp_path)
    assert (out / "policy" / "config.json").is_file()

    report = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "quickstart_report.py"), str(out)],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stdout + report.stderr
    for line in ("reward model          validation accuracy", "policy reward         before",
                 "KL to the start", "judged win rate", "policy (HF)"):
        assert line in report.stdout, report.stdout
    assert "n/a" not in report.stdout, report.stdout
