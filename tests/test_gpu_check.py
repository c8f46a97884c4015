"""scripts/gpu_check.sh on a machine without CUDA: it refuses to run, and every command it would run
on a GPU node parses (the CLI's --print_config) with the settings the check is about."""

from __future__ import annotations

import contextlib
import io
import shlex
import subprocess

import pytest
import yaml

from lit_rlhf import cli
from tests.helpers import REPO_ROOT, subprocess_env

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.sh"
METHODS = ("sft", "reward", "dpo", "kto", "drov", "ppo", "grpo")


def listed_checks() -> dict[str, list[str]]:
    """{check name: its command as argv}, from `gpu_check.sh --print`."""
    out = subprocess.run(["bash", str(SCRIPT), "--print"], capture_output=True, text=True, check=True).stdout
    return {name: shlex.split(command) for name, command in (line.split("\t") for line in out.splitlines())}


def test_without_cuda_it_says_so_and_exits_nonzero():
    env = {**subprocess_env(), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gpu_check: no CUDA device" in done.stderr and "need a CUDA machine" in done.stderr
    assert "PASS" not in done.stdout and "FAIL" not in done.stdout  # nothing ran


def test_it_lists_every_check_the_gpu_paths_need():
    checks = listed_checks()
    assert set(checks) == {f"{m}-bf16" for m in METHODS} | {"grpo-vllm", "sft-zero2", "sft-zero3", "sft-packed-varlen",
                                                           "logprobs-chunked-bf16"}
    assert list(checks)[0] == "reward-bf16"  # ppo and grpo read the reward model it exports
    assert checks["logprobs-chunked-bf16"][1:] == [str(REPO_ROOT / "scripts" / "gpu_check_logprobs.py"), "--device", "cuda",
                                                   "--model", "smollm2-135m-instruct"]
    bad = subprocess.run(["bash", str(SCRIPT), "--only", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown check nope" in bad.stderr


def resolved_config(argv: list[str]) -> dict:
    """The config `main.py <argv>` would run, as `--print_config` prints it (nothing is built)."""
    args = argv[argv.index(str(REPO_ROOT / "main.py")) + 1:]
    printed = io.StringIO()
    with pytest.raises(SystemExit) as done, contextlib.redirect_stdout(printed):
        cli.main([*args, "--print_config"])
    assert done.value.code in (0, None), args
    return yaml.safe_load(printed.getvalue())


def test_every_fit_command_parses_with_the_settings_it_checks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # DeepSpeed logs its accelerator choice to the stdout it finds at import: import it before
    # --print_config's output is captured, so that output is the YAML alone
    from deepspeed.accelerator import get_accelerator

    get_accelerator()
    checks = {name: argv for name, argv in listed_checks().items() if str(REPO_ROOT / "main.py") in argv}
    assert len(checks) == len(METHODS) + 4
    for name, argv in checks.items():
        config = resolved_config(argv)
        trainer, model = config["trainer"], config["model"]["init_args"]
        assert (trainer["accelerator"], str(trainer["devices"]), trainer["precision"]) == ("gpu", "1", "bf16-mixed"), name
        strategy = trainer.get("strategy")
        if name.startswith("sft-zero"):
            assert strategy["class_path"].endswith("DeepSpeedStrategy") and strategy["init_args"]["stage"] == int(name[-1])
        else:
            assert not isinstance(strategy, dict), name
        assert config["data"]["init_args"].get("packing", False) is (name == "sft-packed-varlen"), name
        source = model.get("rollout") or {}
        if name == "grpo-vllm":
            assert source["class_path"] == "lit_rlhf.online.VLLMSampler"
            assert source["init_args"]["engine_kwargs"] == {"gpu_memory_utilization": 0.3, "dtype": "bfloat16"}
        elif source:
            assert source["class_path"] == "lit_rlhf.online.HFSampler", name


def test_the_logprob_check_passes_on_cpu_with_the_tiny_model():
    """The script gpu_check.sh runs on CUDA, run here on the CPU (bf16 autocast works there too)."""
    done = subprocess.run(["python", str(REPO_ROOT / "scripts" / "gpu_check_logprobs.py"), "--device", "cpu", "--model",
                           "tiny-random-llama", "--length", "32"], capture_output=True, text=True, env=subprocess_env())
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["ok fp32", "ok bf16 autocast"]


def test_the_bf16_bound_is_counted_in_bf16_steps():
    """`bf16_step(x)` is the distance from a bf16 number of magnitude x to the next one up."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_logprobs", REPO_ROOT / "scripts" / "gpu_check_logprobs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    import torch

    for magnitude in (0.3, 1.0, 5.0, 20.0, 31.9, 32.0, 100.0):
        x = torch.tensor(magnitude, dtype=torch.bfloat16)
        spacing = float(torch.nextafter(x, torch.tensor(float("inf"), dtype=torch.bfloat16)) - x)
        assert script.bf16_step(float(x)) == spacing, magnitude
    assert script.bf16_step(20.0) == 0.125  # a one-step flip of a logit in [16, 32): the 0.13 seen on an H200
