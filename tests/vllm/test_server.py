"""Asynchronous GRPO and PPO on a real vLLM server process (`AsyncRollouts(server=VLLMServerBackend(...))`):
through `main.py fit`, staleness and the sampler/trainer log-prob gap logged, a LoRA policy's
adapter served as a LoRA model; weight-sync failures (wrong version, server killed) are
clear errors within their deadlines. The session's server (`conftest.server`)."""

from __future__ import annotations

import os
import random
import signal

import pytest
from lightning.pytorch.callbacks import Callback

from lit_rlhf.async_rollouts import ProducerFailed
from lit_rlhf.generation.server import ServerClient
from lit_rlhf.generation.weight_sync import FileWeightSync, WeightVersionError
from lit_rlhf.online import AsyncRollouts, VLLMServerBackend
from tests.async_rollouts.test_async_grpo import PromptCounter, trained_prompts
from tests.modules.test_ppo_cli import CONFIGS, exported_reward_model, run_config  # noqa: F401
from tests.resume.harness import Interrupt, Setup, assert_same_run, fit

def tb_scalars(log_dir) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[float]] = {}
    for events in log_dir.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return out


@pytest.mark.parametrize("method", ["grpo", "ppo_lora"])
def test_async_fit_on_the_server_through_the_cli(method, server, vllm_model_dir, exported_reward_model, tmp_path):
    """GRPO (full weights: a stamped file per version) and LoRA PPO (the policy adapter only)."""
    config = CONFIGS / "tldr" / f"{method}.yaml"
    extra = ["--data.init_args.batch_size=2", "--data.init_args.eval_batch_size=2",
             f"--model.init_args.model={vllm_model_dir}",
             '--model.init_args.rollout={"class_path": "lit_rlhf.online.AsyncRollouts", "init_args": {"max_staleness": 1, '
             f'"server": {{"class_path": "lit_rlhf.online.VLLMServerBackend", "init_args": {{"url": "{server.url}"}}}}}}}}',

             "--model.init_args.temperature=1.0", "--trainer.logger.init_args.version=run"]
    extra += (["--model.init_args.num_generations=2"] if method == "grpo" else
              ["--model.init_args.ppo_epochs=1", "--model.init_args.lora={\"r\": 4, \"alpha\": 8}"])  # the server serves rank <= 8
    run_config(config, tmp_path, exported_reward_model, "bundled:tldr_sft", extra)
    scalars = tb_scalars(tmp_path / "tb")
    staleness = scalars["train/async/staleness_max"]  # batches 0 and 1 on version 0, then k on k - 1
    assert staleness[0] == 0.0 and set(staleness[1:]) == {1.0} and len(staleness) >= 2, staleness
    gap = scalars["train/rollout/sampler_logprob_diff_max"]
    assert gap[0] < 1e-3, gap  # the server holds the learner's weights at step 1: only the kernels differ
    assert "train/perf/trainer_idle_fraction" in scalars and "val/objective/scores" in scalars
    assert 0 < max(scalars["train/time/weight_sync_check"]) < 30  # every version pushed was checked
    assert (tmp_path / "export" / "config.json").is_file()


def distinct_characters(prompts, completions, **columns):
    """The number of distinct characters of each completion (this random model's texts differ in it)."""
    return [float(len(set(c))) for c in completions]


def test_async_run_on_the_server_resumes_exactly_with_every_prompt_once(server, vllm_model_dir, tmp_path):
    """GRPO on the server, every batch one version old (4 rollouts of 2 prompts: the 6 prompts'
    first epoch and a third of the second): stopped by a SIGTERM at a seeded-random learner moment,
    then by a SIGKILL, and resumed from `last.ckpt` each time, the run ends bitwise equal to the
    uninterrupted one, every prompt trained on once per epoch. The server keeps whatever weights
    the last run pushed: each run pushes its own version before sampling. `VLLMServerBackend(concurrency=1)`
    (each request alone): with the default 64 the log-probs' last bits follow the batching, and
    this test fails."""
    setup = Setup("grpo", max_steps=4, model=vllm_model_dir,
                  module_args={"rollout": AsyncRollouts(max_staleness=1, server=VLLMServerBackend(server.url, concurrency=1)),
                               "reward_fns": [distinct_characters]})
    counter = PromptCounter()
    straight = fit(setup, tmp_path / "straight", extra_callbacks=(counter,))
    metrics = list(straight.recorder.metrics.values())
    assert [m["train/async/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0, 1.0]
    assert all(m["train/advantages/abs_mean"] > 0 for m in metrics)  # the weights move with the samples
    rng = random.Random(33)
    hooks = ["on_rollout_scores", "on_after_backward", "on_train_batch_end", "on_save_checkpoint"]
    moments = [Interrupt(rng.choice(hooks), rng.randint(1, 2), signal.SIGTERM), Interrupt(rng.choice(hooks), 1, None)]
    root, last = tmp_path / "split", tmp_path / "split" / "checkpoints" / "last.ckpt"
    runs, counters = [], []
    for moment in [*moments, None]:
        counters.append(PromptCounter())
        run = fit(setup, root, moment, str(last) if last.exists() else None, extra_callbacks=(counters[-1],))
        assert moment is None or run.killed or run.exit_code is not None, f"{moment.hook} #{moment.n} did not stop the run"
        runs.append(run)
    assert_same_run(straight, runs[:-1], runs[-1], tmp_path / "straight", root)
    trained = trained_prompts(counters, counter)
    assert set(trained.values()) == {1} and {i for epoch, i in trained if epoch == 0} == set(range(6))


def test_a_wrongly_stamped_weight_file_is_a_named_error(server, vllm_model_dir, tmp_path):
    from safetensors.torch import load_file

    client = ServerClient(server, vllm_model_dir, timeout=120)
    weights = load_file(os.path.join(vllm_model_dir, "model.safetensors"))
    files = FileWeightSync(tmp_path)
    files.publish(3, weights)
    with pytest.raises(WeightVersionError, match="stamped version 3"):
        client.load_weights_file(files.path(3), 4)
    client.load_weights_file(files.path(3), 3)
    assert client.weight_version() == "3"
    # deadlines (a server that never answers, the server's own load deadline) are tested without vLLM:
    # tests/async_rollouts/test_server_client.py


class KillServer(Callback):
    """SIGKILL the module's own vLLM server after the first training batch."""

    process = None

    def on_train_batch_end(self, trainer, pl_module, *args):
        if trainer.global_step == 1:
            self.process = pl_module.rollout_source.running.producer.sampler.owned_server.process
            os.killpg(self.process.pid, signal.SIGKILL)


def test_a_server_the_trainer_starts_is_stopped_and_its_death_is_a_clear_error(vllm_model_dir, tmp_path):
    """Without server_url the trainer starts the server; killed mid-run, the next step raises the
    server's exit (not a hang), and nothing of it is left running."""
    import lightning as L

    from lit_rlhf.data import TLDRPromptDataModule
    from lit_rlhf.modules import GRPOModule
    from lit_rlhf.rewards import CharacterFractionReward

    L.seed_everything(0)
    module = GRPOModule(model=vllm_model_dir, reward_fns=[CharacterFractionReward("abcdefghijklmnopqrstuvwxyz")],
                        num_generations=2, max_new_tokens=4, kl_coef=0.0, log_completions_every_n_steps=0,
                        rollout=AsyncRollouts(max_staleness=0, timeout=900,
                                              server=VLLMServerBackend(engine_kwargs={"max_model_len": 256})))
    dm = TLDRPromptDataModule(tokenizer=vllm_model_dir, path="bundled:tldr_sft", max_prompt_length=96, limit=6,
                              batch_size=2, val_split=None, test_split=None)
    kill = KillServer()
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[kill],
                        default_root_dir=tmp_path)
    with pytest.raises(ProducerFailed, match="exited with code -9"):
        trainer.fit(module, datamodule=dm)
    assert (tmp_path / "vllm_server.log").is_file()
    assert module.rollout_source.running is None and kill.process.poll() is not None  # the producer stopped, the server gone
