"""The main job's selection on the validation posts (scripts/quickstart_select.py), its longer
profile (QUICKSTART_PROFILE=long in scripts/quickstart.sh) and their rendered blocks."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import subprocess
import sys

import pytest
import yaml

from tests.helpers import REPO_ROOT, subprocess_env


def _load(name):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    spec.loader.exec_module(module)
    return module


select = _load("quickstart_select")
render = _load("render_quickstart")
VALIDATION = [json.loads(line) for line in
              (REPO_ROOT / "lit_rlhf/data/bundled/keyfact_chat.validation_sft.jsonl").read_text().splitlines()]


def _reference(row):
    return row["messages"][-1]["content"]


def _result(path, seed, kl, after):
    """A results.json of one validation run whose trained answers are `after(reference)`."""
    samples = [{"reference": _reference(r), "before": "I do not know.", "after": after(_reference(r))}
               for r in VALIDATION]
    path.write_text(json.dumps({"created": "2026-11-27T20:00:00+00:00", "seed": seed, "wall_seconds": 300,
                                "machine": {"load_average_1_5_15": [1.0, 1.0, 1.0]}, "grpo": {"kl_coef": kl},
                                "evaluation": {"split": "validation_sft"}, "samples": samples}))
    return path


@pytest.mark.parametrize("better", [0.04, 0.1])
def test_the_rule_keeps_the_value_with_the_higher_f1(tmp_path, better):
    """The value whose answers state the key fact wins, whichever it is; the other says extra words too."""
    files = {}
    for seed in (8, 9):
        files[seed] = {kl: _result(tmp_path / f"seed{seed}-kl{kl:g}.json", seed, kl,
                                   (lambda ref: ref) if kl == better else (lambda ref: ref + " She is 27 and in Leeds, "
                                                                                          "it is a long story."))
                       for kl in (0.04, 0.1)}
    result = select.choose(files, "bundled:keyfact_checks")
    assert result["chosen"] == better
    assert result["chosen_is_shipped"] == (better == 0.1)
    assert result["answerers"][f"kl_coef {better:g}"]["f1"]["mean"] == 1.0
    loser = 0.1 if better == 0.04 else 0.04
    assert result["f1"][f"kl_coef {loser:g}"] < 1.0
    # both values stated the whole key fact: recall cannot tell them apart, F1 can
    assert result["answerers"][f"kl_coef {loser:g}"]["recall"]["mean"] == 1.0
    difference = result["differences"][f"kl_coef {better:g} - kl_coef {loser:g}"]["f1"]
    assert difference["ci_low"] > 0 and difference["num_seeds"] == 2 and difference["num_prompts"] == 32
    assert [i["seed"] for i in result["inputs"]] == [8, 8, 9, 9]


def test_selection_refuses_the_reported_seeds():
    with contextlib.redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit):
        select.main(["--seeds", "6", "8"])
    assert "seeds [6] are reported seeds" in err.getvalue()


def _goal_files(folder, low, high):
    folder.mkdir(parents=True)
    golds = json.loads((REPO_ROOT / "results/quickstart/golds/seeds6-7.json").read_text())
    golds["differences"]["trained - first_sentence"]["f1"].update(mean=(low + high) / 2, ci_low=low, ci_high=high)
    (folder / "golds.json").write_text(json.dumps(golds))
    run = json.loads((REPO_ROOT / "results/quickstart/seed7.json").read_text())
    run["grpo"] = {"kl_coef": 0.1, "batch_size": 4, "num_generations": 4}
    (folder / "seed10.json").write_text(json.dumps(run))


@pytest.mark.parametrize("low, high, verdict", [(0.01, 0.05, "met"), (-0.05, 0.02, "not shown"),
                                                (-0.3, -0.1, "failed")])
def test_the_long_profile_is_read_against_its_goal(tmp_path, monkeypatch, low, high, verdict):
    monkeypatch.setattr(render, "ROOT", tmp_path)
    assert "has not been run yet" in render.long_block(tmp_path / "long")
    _goal_files(tmp_path / "long", low, high)
    block = render.long_block(tmp_path / "long")
    assert f"on the key-fact F1: {verdict}**" in block


def _profile_arguments(step):
    """The long profile's extra arguments of `step` (REWARD or GRPO) as scripts/quickstart.sh writes them."""
    script = (REPO_ROOT / "scripts" / "quickstart.sh").read_text()
    long = script[script.index("  long)"):script.index(";;", script.index("  long)"))]
    found = re.search(rf"{step}\+=\(([^)]*)\)", long)
    assert found, f"no {step} arguments in the long profile"
    return found.group(1).split()


@pytest.mark.parametrize("recipe, step, expected", [
    ("grpo", "GRPO", {("model", "total_episodes"): 512, ("data", "batch_size"): 4}),
    ("reward", "REWARD", {("data", "train_split"): "train_prefs"}),
])
def test_the_long_profile_resolves_through_the_cli(recipe, step, expected):
    command = [sys.executable, str(REPO_ROOT / "main.py"), "fit", "--config",
               str(REPO_ROOT / "configs" / "quickstart" / f"{recipe}.yaml"), *_profile_arguments(step), "--print_config"]
    done = subprocess.run(command, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    config = yaml.safe_load(done.stdout)
    for (section, key), value in expected.items():
        assert config[section]["init_args"][key] == value


def test_quickstart_refuses_an_unknown_profile():
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "quickstart.sh")], env={**subprocess_env(),
                          "QUICKSTART_PROFILE": "longer"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "QUICKSTART_PROFILE must be default or long" in done.stderr
