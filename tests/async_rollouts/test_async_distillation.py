"""On-policy distillation with asynchronous rollouts (the tiny model, `tests/resume/harness.py`'s
"distill" case: the starting weights given a context are the teacher, the task reward mixed in):
`max_staleness: 0` is the synchronous run bitwise; with stale samples the policy-gradient term is
weighed by the truncated importance weights, and a run stopped by SIGTERM and resumed is the
uninterrupted one bitwise."""

from __future__ import annotations

import signal

import pytest
import torch

from lit_rlhf.online import AsyncRollouts
from tests.async_rollouts.test_async_grpo import ASYNC_ONLY
from tests.resume.harness import Interrupt, Setup, assert_same_run, checkpoint_values, fit

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_max_staleness_0_is_the_synchronous_distillation_bitwise(tmp_path):
    sync = fit(Setup("distill"), tmp_path / "sync")
    lockstep = fit(Setup("distill", module_args={"rollout": AsyncRollouts(max_staleness=0)}), tmp_path / "async")
    a, b = (checkpoint_values(p / "checkpoints" / "last.ckpt") for p in (tmp_path / "sync", tmp_path / "async"))
    b = {k: v for k, v in b.items() if "rollout_source" not in k}
    assert a.keys() == b.keys()
    assert not [k for k in a if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k])]
    for step, metrics in sync.recorder.metrics.items():
        logged = lockstep.recorder.metrics[step]
        assert {k: v for k, v in logged.items() if not any(x in k for x in ASYNC_ONLY)} == metrics


def test_stale_distillation_is_weighed_and_resumes_exactly(tmp_path):
    setup = Setup("distill", max_steps=4, module_args={"rollout": AsyncRollouts(max_staleness=1)})
    straight = fit(setup, tmp_path / "straight")
    assert straight.module.rollout_source.tis_cap == 2.0  # stale samples: weighed by default
    metrics = straight.recorder.metrics
    assert [metrics[k]["train/async/staleness_max"] for k in range(1, 5)] == [0.0, 1.0, 1.0, 1.0]
    root, last = tmp_path / "split", tmp_path / "split" / "checkpoints" / "last.ckpt"
    first = fit(setup, root, Interrupt("on_train_batch_end", 2, signal.SIGTERM))
    assert first.exit_code is not None
    final = fit(setup, root, None, str(last))
    assert_same_run(straight, [first], final, tmp_path / "straight", root)
