"""The README's main job, shortened: the same quickstart configs and commands on the tiny model.

`scripts/quickstart.sh` runs these calls on SmolLM2-135M-Instruct; here each runs in a temporary
working directory (the configs write under `outputs/quickstart`), with the tiny model, two reward
steps and two GRPO rollouts. The comparison and the report must then find every number they print.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REPO_ROOT, subprocess_env

CONFIGS = REPO_ROOT / "configs" / "quickstart"
TINY = "--model.init_args.model=tiny-random-llama"


def run(args, cwd, module=None):
    command = [sys.executable, "-m", module, *args] if module else [sys.executable, str(REPO_ROOT / "main.py"), *args]
    done = subprocess.run(command, cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def test_quickstart_pipeline_on_the_tiny_model(tmp_path):
    run(["fit", "--config", str(CONFIGS / "reward.yaml"), TINY, "--trainer.max_steps=2", "--trainer.limit_val_batches=1"],
        tmp_path)
    out = tmp_path / "outputs" / "quickstart"
    assert (out / "reward_model" / "config.json").is_file()
    assert (out / "reward" / "checkpoints" / "last.ckpt").is_file()

    run(["fit", "--config", str(CONFIGS / "grpo.yaml"), TINY, "--model.init_args.total_episodes=16",
         "--model.init_args.max_new_tokens=8"], tmp_path)
    assert (out / "policy" / "config.json").is_file()

    run(["--before", "tiny-random-llama", "--after", str(out / "policy"), "--prompts", "bundled:keyfact_sft",
         "--split", "test", "--num_prompts", "8", "--max_new_tokens", "6", "--reward_model", str(out / "reward_model"),
         "--pairs", "bundled:keyfact_comparisons", "--pairs_split", "test[:8]", "--output",
         str(out / "comparison.json")], tmp_path, module="lit_rlhf.compare_policies")
    report = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "quickstart_report.py"), str(out),
                             "--seconds", "61"], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stdout + report.stderr
    for line in ("reward model          held-out pair accuracy", "optimised reward      ", "gold (key fact)",
                 "gold win rate", "KL to the start", "wall time             1 min 1 s", "policy (HF)"):
        assert line in report.stdout, report.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["seed"] == 1 and results["reward"]["n"] == 8 and len(results["samples"]) == 8
    assert results["reward_model"]["accuracy"]["n"] == 8
    sample = results["samples"][0]
    assert set(sample) >= {"prompt", "reference", "before", "after", "reward_before", "gold_after"}
    # the tiny random model learns nothing in two rollouts: the report must say so, and --strict must fail
    if results["gold"]["ci_low"] <= 0:
        assert "did not show learning" in report.stderr
        strict = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "quickstart_report.py"), str(out),
                                 "--strict"], capture_output=True, text=True, timeout=120)
        assert strict.returncode == 1
