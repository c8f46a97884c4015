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
# the tiny tokenizer is byte-level: a chat post is ~330 tokens, an answer up to ~150
BYTES = ["--data.init_args.max_prompt_length=512"]
# the recipe's LoRA on the top blocks, on the tiny model's 2 blocks: its top one
TINY_LORA = ("--model.init_args.lora={class_path: peft.LoraConfig, init_args: {r: 4, lora_alpha: 8, "
             "target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj], layers_to_transform: [1]}}")


def run(args, cwd, module=None):
    command = [sys.executable, "-m", module, *args] if module else [sys.executable, str(REPO_ROOT / "main.py"), *args]
    done = subprocess.run(command, cwd=cwd, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done


def test_quickstart_pipeline_on_the_tiny_model(tmp_path):
    run(["fit", "--config", str(CONFIGS / "reward.yaml"), TINY, "--trainer.max_steps=2", TINY_LORA,
         *BYTES, "--data.init_args.max_completion_length=160", "--data.init_args.truncate_completions=true"], tmp_path)
    out = tmp_path / "outputs" / "quickstart"
    assert (out / "reward_model" / "config.json").is_file()
    assert (out / "reward" / "checkpoints" / "last.ckpt").is_file()

    run(["fit", "--config", str(CONFIGS / "grpo.yaml"), TINY, "--model.init_args.total_episodes=16",
         "--model.init_args.max_new_tokens=8", *BYTES], tmp_path)
    assert (out / "policy" / "config.json").is_file()

    command = (REPO_ROOT / "scripts" / "quickstart.sh").read_text()
    args = command[command.index("python -m lit_rlhf.apps.compare_policies --") :].split(">")[0].replace("\\\n", " ").split()[3:]
    args = [a.replace('"$OUT', str(out)).strip('"') for a in args]
    settings = dict(zip(args[::2], args[1::2]))
    assert settings["--num_prompts"] == "64" and settings["--before"] == "smollm2-135m-instruct"
    assert settings["--split"] == "$SPLIT" and "test_sft) PAIRS=bundled:keyfact_chat ;;" in command  # the default
    assert settings["--baselines"] == "first_sentence,title,post,reference"
    settings.update({"--split": "test_sft", "--pairs": "bundled:keyfact_chat", "--before": "tiny-random-llama",
                     "--num_prompts": "8", "--max_new_tokens": "6", "--pairs_split": "test_prefs[:8]"})
    run([x for kv in settings.items() for x in kv], tmp_path, module="lit_rlhf.apps.compare_policies")
    report = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "quickstart_report.py"), str(out),
                             "--seconds", "61"], capture_output=True, text=True, timeout=120,
                            env=subprocess_env())
    assert report.returncode == 0, report.stdout + report.stderr
    for line in ("reward model          held-out pair accuracy", "optimised reward      ", "gold (key fact)", "ended with EOS",
                 "gold win rate", "KL to the start", "wall time             1 min 1 s", "policy (HF)", "key-fact golds",
                 "  first_sentence"):
        assert line in report.stdout, report.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["seed"] == 1 and results["reward"]["n"] == 8 and len(results["samples"]) == 8
    # step 2's settings as the run resolved them (the selection and the longer profile change them)
    assert results["grpo"]["total_episodes"] == 16 and results["grpo"]["kl_coef"] == 0.1
    assert results["grpo"]["batch_size"] == 2 and results["grpo"]["num_generations"] == 4
    assert results["reward_model"]["accuracy"]["n"] == 8
    sample = results["samples"][0]
    assert set(sample) >= {"prompt", "reference", "before", "after", "reward_before", "gold_after"}
    # the trivial answers beside the policies, scored by every gold and the reward model
    assert list(results["answerers"]) == ["start", "trained", "first_sentence", "title", "post", "reference"]
    assert set(results["answerers"]["title"]) == {"recall_v1", "recall", "f1", "distractor", "false", "reward"}
    assert results["answerers"]["reference"]["recall"]["mean"] == 1.0
    assert results["answerers"]["post"]["distractor"]["mean"] == 1.0
    assert "trained - first_sentence" in results["differences"]
    # the validation posts, where settings are chosen: no held-out pairs (they are the test posts')
    settings.update({"--split": "validation_sft", "--pairs": "", "--num_prompts": "64",
                     "--output": str(tmp_path / "validation.json")})
    run([x for kv in settings.items() for x in kv], tmp_path, module="lit_rlhf.apps.compare_policies")
    validation = json.loads((tmp_path / "validation.json").read_text())
    assert validation["reward"]["n"] == 32 and "reward_model" not in validation  # all 32 validation posts
    assert validation["answerers"]["reference"]["f1"]["mean"] == 1.0
    # the tiny random model learns nothing in two rollouts: the report must say so, and --strict must fail
    if results["gold"]["ci_low"] <= 0:
        assert "did not show learning" in report.stderr
        strict = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "quickstart_report.py"), str(out),
                                 "--strict"], capture_output=True, text=True, timeout=120, env=subprocess_env())
        assert strict.returncode == 1


def test_quickstart_refuses_an_unknown_split():
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "quickstart.sh")], env={**subprocess_env(),
                          "QUICKSTART_SPLIT": "test"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "QUICKSTART_SPLIT must be test_sft or validation_sft" in done.stderr
