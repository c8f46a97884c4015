"""Asynchronous PPO with a LoRA policy (the sampler's copy gets the policy adapter only): an
interrupted and resumed run is the uninterrupted one, bitwise, with staleness bounded."""

from __future__ import annotations

import signal

import pytest

from lit_rlhf.online import AsyncRollouts
from tests.resume.harness import Interrupt, Setup, assert_same_run, fit

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_async_lora_ppo_resumes_exactly(tmp_path):
    setup = Setup("ppo_lora", max_steps=3 * 4, module_args={"rollout": AsyncRollouts(max_staleness=1)})  # 3 rollouts of 4 PPO steps
    straight = fit(setup, tmp_path / "straight")
    staleness = [m["train/async/staleness_max"] for m in straight.recorder.metrics.values()]
    assert staleness == [0.0, 1.0, 1.0] and straight.module.rollout_source.tis_cap == 2.0
    assert all(m["train/rollout/sampler_logprob_diff_max"] < 1.0 for m in straight.recorder.metrics.values())
    root, last = tmp_path / "split", tmp_path / "split" / "checkpoints" / "last.ckpt"
    stopped = fit(setup, root, Interrupt("on_rollout_scores", 2, signal.SIGTERM))
    assert stopped.exit_code is not None
    final = fit(setup, root, None, str(last))
    assert_same_run(straight, [stopped], final, tmp_path / "straight", root)
