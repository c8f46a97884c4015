"""Training stats are logged on the steps the logger writes; other steps log only the progress bar's (if any).
Every scalar is written at the optimizer steps done (`lit_rlhf.training.step_logging`): training and
validation, automatic and manual optimisation, on one axis."""

from __future__ import annotations

import csv

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lit_rlhf.data.collate import PromptCollator
from lit_rlhf.modules import GRPOModule, PPOModule, SFTModule
from lit_rlhf.rewards import CharacterFractionReward
from lit_rlhf.types import SFTBatch

PROMPTS = ["hello there", "what is", "tell me a story", "x", "abc", "The cat", "Q: 2+2?", "once"]


def constant_reward(prompts, completions, **columns):
    return [float(len(c) % 3) for c in completions]


class CountingGRPO(GRPOModule):
    """Records the names given to `self.log` in each training step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.logged: list[set[str]] = []

    def on_train_batch_start(self, batch, batch_idx):
        super().on_train_batch_start(batch, batch_idx)
        self.logged.append(set())

    def log(self, name, *args, **kwargs):
        self.logged[-1].add(name)
        super().log(name, *args, **kwargs)


@pytest.mark.parametrize("progress_bar", [True, False])
def test_step_stats_reach_the_logger_every_n_steps_and_the_progress_bar_every_step(tmp_path, progress_bar):
    torch.manual_seed(0)
    module = CountingGRPO(model="tiny-random-llama", reward_fns=[constant_reward], num_generations=2, max_new_tokens=4,
                          log_completions_every_n_steps=0)
    rows = [{"_prompt_ids": module.tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in PROMPTS]
    loader = DataLoader(rows, batch_size=2, collate_fn=PromptCollator(module.tokenizer.pad_token_id))
    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=L.pytorch.loggers.CSVLogger(tmp_path), log_every_n_steps=2,
                        enable_checkpointing=False, enable_progress_bar=progress_bar, enable_model_summary=False)
    trainer.fit(module, loader)

    prog_bar = {"train/objective/scores", "train/objective/kl"}
    full = {"train/objective/entropy", "train/time/generation", "train/perf/tokens_per_sec", "train/objective/episodes"}
    assert len(module.logged) == 4
    for step, names in enumerate(module.logged):
        if (step + 1) % 2 == 0:  # a logging step: everything
            assert prog_bar | full <= names, step
        else:  # only what the progress bar shows, if there is one
            assert names == (prog_bar if progress_bar else set()), (step, names)
    (path,) = list(tmp_path.rglob("metrics.csv"))
    written = [row for row in csv.DictReader(path.open()) if row.get("train/objective/entropy")]
    assert [int(row["step"]) for row in written] == [2, 4]  # the 2nd and 4th optimizer steps
    for row in written:
        assert all(row[name] != "" for name in prog_bar | full)


def csv_rows(tmp_path) -> list[dict[str, str]]:
    (path,) = list(tmp_path.rglob("metrics.csv"))
    return list(csv.DictReader(path.open()))


def steps_of(rows, name) -> list[int]:
    return [int(row["step"]) for row in rows if row.get(name)]


def sft_loader(tokenizer, batches):
    texts = [("Q: sky?\nA:", " blue"), ("Q: grass?\nA:", " green"), ("Q: snow?\nA:", " white"), ("Q: coal?\nA:", " black")]
    rows = []
    for prompt, completion in (texts * batches)[:batches]:
        p, c = tokenizer(prompt)["input_ids"], tokenizer(completion)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(SFTBatch(torch.tensor([p + c]), torch.ones(1, len(p) + len(c), dtype=torch.bool),
                             torch.tensor([[False] * len(p) + [True] * len(c)])))
    return DataLoader(rows, batch_size=None)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_sft_train_and_validation_scalars_share_the_optimizer_step_axis(tmp_path, accumulate):
    """4 optimizer steps, validation every 2: train scalars at 1..4 (under accumulation, those of
    the batch that completes each window), validations at 2 and 4, the steps they ran after."""
    torch.manual_seed(0)
    module = SFTModule(model="tiny-random-llama", lr=1e-3)
    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=L.pytorch.loggers.CSVLogger(tmp_path), log_every_n_steps=1,
                        val_check_interval=2 * accumulate, check_val_every_n_epoch=None, accumulate_grad_batches=accumulate,
                        num_sanity_val_steps=0, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, sft_loader(module.tokenizer, 4 * accumulate), sft_loader(module.tokenizer, 2))
    rows = csv_rows(tmp_path)
    assert trainer.global_step == 4
    assert steps_of(rows, "train/loss") == [1, 2, 3, 4]
    assert steps_of(rows, "val/loss") == [2, 4]
    assert steps_of(rows, "train/perf/tokens_per_sec") == [1, 2, 3, 4]  # timed from each batch's start
    assert all(float(row["epoch"]) == 0 for row in rows)  # the epoch column is kept (logged beside the step)


def test_ppo_logs_at_the_global_step_not_the_rollout_index(tmp_path):
    """2 rollouts of 2 optimizer steps each (ppo_epochs 2, one minibatch): the rollouts' stats at
    global steps 2 and 4, the validation after the 2nd rollout at 4, where `trainer.global_step`
    (the console's "global step") ends."""
    torch.manual_seed(0)
    module = PPOModule(model="tiny-random-llama", reward_fns=[CharacterFractionReward()], max_new_tokens=4, ppo_epochs=2,
                       num_minibatches=1, total_episodes=16, log_completions_every_n_steps=0)
    rows = [{"_prompt_ids": module.tokenizer(p, add_special_tokens=False)["input_ids"], "prompt": p} for p in PROMPTS]
    loader = DataLoader(rows, batch_size=8, collate_fn=PromptCollator(module.tokenizer.pad_token_id))
    trainer = L.Trainer(max_epochs=-1, accelerator="cpu", logger=L.pytorch.loggers.CSVLogger(tmp_path), log_every_n_steps=1,
                        val_check_interval=2, check_val_every_n_epoch=None, limit_val_batches=1, num_sanity_val_steps=0,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, loader, loader)
    written = csv_rows(tmp_path)
    assert module.rollouts == 2 and trainer.global_step == 4
    assert steps_of(written, "train/objective/scores") == [2, 4]
    assert steps_of(written, "val/objective/scores") == [4]


def test_attached_trainer_is_none_until_a_trainer_runs_the_module(tmp_path):
    """`TrainingModule.attached_trainer`: None where `self.trainer` would raise (no Trainer yet),
    the Trainer once one runs the module (what the logging and the guard ask before using it)."""
    module = SFTModule(model="tiny-random-llama", lr=1e-3)
    assert module.attached_trainer is None
    with pytest.raises(RuntimeError):
        module.trainer
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, sft_loader(module.tokenizer, 1))
    assert module.attached_trainer is trainer
