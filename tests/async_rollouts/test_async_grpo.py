"""Asynchronous GRPO on the tiny model (`tests/resume/harness.py`: rollouts of 2 prompts x 2
responses, KL control): `max_staleness: 0` is the synchronous run bitwise; an asynchronous run
stopped at seeded-random moments (SIGTERM at a learner hook or from the producer thread,
SIGKILL) and resumed is the uninterrupted one bitwise, every prompt trained on once per epoch; a
failing producer is a clear error in the learner."""

from __future__ import annotations

import os
import random
import signal
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from lit_rlhf.async_rollouts import LocalSampler, ProducerFailed
from lit_rlhf.online import AsyncRollouts
from tests.resume.harness import Interrupt, Setup, assert_same_run, checkpoint_values, fit

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ASYNC_ONLY = ("async/", "sampler_logprob_diff", "rollout_correction/")  # logged by asynchronous runs only


class PromptCounter(Callback):
    """The dataset rows of every trained batch, by batch number (1-based over the whole fit), with its epoch."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[int, list[int]]] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows[trainer.fit_loop.total_batch_idx + 1] = (trainer.current_epoch, list(batch.meta["index"]))


def trained_prompts(counters: list[PromptCounter], straight: PromptCounter) -> Counter:
    """How often each (epoch, row) was trained on over the interrupted runs and the final one. A
    later run re-trains only the batches an earlier one lost with its checkpoint (SIGKILL), so the
    batches of the checkpointed history must be the straight run's, batch for batch."""
    merged: dict[int, tuple[int, list[int]]] = {}
    for c in counters:
        merged.update(c.rows)
    assert merged == straight.rows
    return Counter((epoch, i) for epoch, rows in merged.values() for i in rows)


class ProducerSigterm:
    """SIGTERM to this process from the producer thread as it starts sampling the `n`-th batch of
    the run: a moment inside the producer's work, wherever the learner then is (a resumed run's
    first batch is sampled while the learner waits for it, a later one while it trains)."""

    def __init__(self, n: int) -> None:
        self.n, self.calls, self.hook = n, 0, f"producer batch #{n}"

    def __enter__(self):
        original, interrupt = LocalSampler.sample, self

        def sample(sampler, index, version, prompts):
            interrupt.calls += 1
            if interrupt.calls == interrupt.n:
                os.kill(os.getpid(), signal.SIGTERM)  # handled in the main thread, the learner's
            return original(sampler, index, version, prompts)

        self._original, LocalSampler.sample = original, sample
        return self

    def __exit__(self, *exc):
        LocalSampler.sample = self._original


def test_max_staleness_0_is_the_synchronous_run_bitwise(tmp_path):
    sync = fit(Setup("grpo"), tmp_path / "sync")
    lockstep = fit(Setup("grpo", module_args={"rollout": AsyncRollouts(max_staleness=0)}), tmp_path / "async")
    assert lockstep.module.rollout_source.tis_cap is None  # no stale sample: no correction by default
    a, b = (checkpoint_values(p / "checkpoints" / "last.ckpt") for p in (tmp_path / "sync", tmp_path / "async"))
    b = {k: v for k, v in b.items() if "rollout_source" not in k}
    assert a.keys() == b.keys()
    assert not [k for k in a if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k])]
    assert sorted(sync.recorder.metrics) == sorted(lockstep.recorder.metrics) == [1, 2, 3, 4]
    for step, metrics in sync.recorder.metrics.items():
        logged = lockstep.recorder.metrics[step]
        assert {k: v for k, v in logged.items() if not any(x in k for x in ASYNC_ONLY)} == metrics
        assert logged["train/async/staleness_max"] == 0.0
        assert logged["train/rollout/sampler_logprob_diff"] < 1e-4  # the same weights: only the kernels differ
    assert lockstep.trainer.callback_metrics["train/time/weight_sync_check"] > 0  # every version checked (sync_check)


def test_async_run_resumes_exactly_from_any_moment_with_every_prompt_once(tmp_path):
    """6 rollouts of 2 prompts (2 epochs of the 6 prompts), every batch 2 versions old: stopped
    three times at moments drawn from a fixed seed (a SIGTERM at a learner hook, a SIGTERM from
    the producer thread mid-work, a SIGKILL) and resumed each time from `last.ckpt`, the run ends
    bitwise equal to the uninterrupted one, and every prompt is trained on exactly once per epoch."""
    setup = Setup("grpo", max_steps=6, module_args={"rollout": AsyncRollouts(max_staleness=2)})
    counter = PromptCounter()
    straight = fit(setup, tmp_path / "straight", extra_callbacks=(counter,))
    assert straight.module.rollout_source.tis_cap == 2.0  # stale samples: truncated importance sampling by default
    metrics = straight.recorder.metrics
    assert [metrics[k]["train/async/staleness_max"] for k in range(1, 7)] == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert all(metrics[k]["train/rollout/sampler_logprob_diff_max"] < 1.0 for k in range(1, 7))
    # the moments: drawn once from a fixed seed, so a failure names them
    rng = random.Random(10)
    hooks = ["on_rollout_scores", "on_after_backward", "on_train_batch_end", "on_save_checkpoint"]
    moments = [Interrupt(rng.choice(hooks), rng.randint(1, 2), signal.SIGTERM), ProducerSigterm(rng.randint(1, 2)),
               Interrupt(rng.choice(hooks), 1, None)]  # None: SIGKILL (nothing saved on the way out)
    root, last = tmp_path / "split", tmp_path / "split" / "checkpoints" / "last.ckpt"
    runs, counters = [], []
    for moment in [*moments, None]:
        counters.append(PromptCounter())
        resume = str(last) if last.exists() else None
        if isinstance(moment, ProducerSigterm):
            with moment:
                run = fit(setup, root, None, resume, extra_callbacks=(counters[-1],))
        else:
            run = fit(setup, root, moment, resume, extra_callbacks=(counters[-1],))
        if moment is not None:
            assert run.killed or run.exit_code is not None, f"{moment.hook} #{moment.n} did not stop the run"
        runs.append(run)
    assert_same_run(straight, runs[:-1], runs[-1], tmp_path / "straight", root)
    trained = trained_prompts(counters, counter)
    assert sorted(trained) == [(epoch, i) for epoch in (0, 1) for i in range(6)]  # no prompt lost
    assert set(trained.values()) == {1}  # none trained twice


def test_a_failing_producer_stops_the_fit_with_its_error(tmp_path, monkeypatch):
    original = LocalSampler.sample

    def broken(self, index, version, prompts):
        if index == 2:
            raise RuntimeError("sampler exploded")
        return original(self, index, version, prompts)

    monkeypatch.setattr(LocalSampler, "sample", broken)
    with pytest.raises(ProducerFailed, match="sampler exploded"):
        fit(Setup("grpo", module_args={"rollout": AsyncRollouts(max_staleness=1)}), Path(tmp_path))
    assert not [t for t in threading.enumerate() if t.name == "lit_rlhf-rollout-producer"]  # stopped, not left behind


def test_async_grpo_with_stale_samples_raises_the_reward(tmp_path):
    """tests/modules/test_grpo.py's learning run (fraction of lowercase letters, 4 prompts x G=4,
    30 rollouts) with every sample 2 versions old (truncated importance sampling on by default).

    Measured, mean score of the last 5 rollouts minus the first 5, seeds 0/1/2: +0.179, +0.102,
    +0.099 (synchronous: +0.149, +0.169, +0.139); seed 0 with the advantages' sign flipped: -0.054.
    """
    import csv

    import lightning as L
    from torch.utils.data import DataLoader, DistributedSampler

    from lit_rlhf.data.collate import PromptCollator
    from lit_rlhf.modules import GRPOModule
    from lit_rlhf.rewards import CharacterFractionReward
    from tests.modules.test_grpo import LETTERS, PROMPTS

    L.seed_everything(0)
    module = GRPOModule(
        model="tiny-random-llama", reward_fns=[CharacterFractionReward(LETTERS)], num_generations=4,
        max_new_tokens=8, lr=1e-3, lr_scheduler="constant", kl_coef=0.01, num_iterations=2, total_episodes=16 * 30,
        rollout=AsyncRollouts(max_staleness=2), log_completions_every_n_steps=0,
    )
    tok = module.tokenizer
    rows = [{"_prompt_ids": tok(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in PROMPTS]
    loader = DataLoader(rows, batch_size=4, sampler=DistributedSampler(rows, num_replicas=1, rank=0, seed=0),
                        collate_fn=PromptCollator(tok.pad_token_id))  # an order that is a function of (seed, epoch)
    trainer = L.Trainer(max_epochs=-1, accelerator="cpu", logger=L.pytorch.loggers.CSVLogger(tmp_path),
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        log_every_n_steps=1)
    trainer.fit(module, loader)
    (path,) = list(tmp_path.rglob("metrics.csv"))
    logged = [r for r in csv.DictReader(path.open()) if r.get("train/objective/scores")]
    scores = [float(r["train/objective/scores"]) for r in logged]
    assert len(scores) == 30
    assert sum(scores[-5:]) / 5 > sum(scores[:5]) / 5 + 0.05, scores
    assert [float(r["train/async/staleness_max"]) for r in logged[:4]] == [0.0, 1.0, 2.0, 2.0]
