"""Training stats are logged on the steps the logger writes; other steps log only the progress bar's (if any)."""

from __future__ import annotations

import csv

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lit_rlhf.data.collate import PromptCollator
from lit_rlhf.modules import GRPOModule

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
    assert [int(row["step"]) for row in written] == [1, 3]
    for row in written:
        assert all(row[name] != "" for name in prog_bar | full)
