"""Single-trajectory data for the DRO replication: (prompt, completion, exact reward) triplets.

`draw_triplets` draws them exactly from the start; `write_triplets` / `read_triplets` keep them
as JSONL (one triplet a line, with the token ids, so training sees exactly the drawn tokens).
`TripletDataModule` turns the file into the batch type each method trains on, with the library's
collators:

- `single` -> `SingleBatch` with rewards normalised to mean 0 / variance 1 over the training
  triplets (DRO paper, Sec. 4; as `UltraFeedbackSingleDataModule`): DRO-V, and KTO with
  `labels_from: rewards` (desirable = reward above the batch mean). A batch holds whole
  prompts: the draws of `batch_size / samples_per_prompt` shuffled prompts, so each prompt's
  forward is shared by its draws (`SingleBatch.sharing`; the same log-probs and gradients as
  one row at a time, for a quarter of the tokens at 4 draws per prompt);
- `pairs` -> `PreferenceBatch`: per prompt, its best- and worst-rewarded completions (first in
  sampling order on ties); a prompt whose completions all score the same gives no pair (DPO);
- `sft` -> `SFTBatch`: the completions whose reward is above the training mean (the
  rejection-sampling baseline).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal, Sequence

import lightning as L
import torch
from torch.utils.data import DataLoader

from experiments.dro_single_trajectory import exact
from lit_rlhf.data.collate import PreferenceCollator, SFTCollator, SingleCollator

Mode = Literal["single", "pairs", "sft"]
MODES = ("single", "pairs", "sft")


def write_triplets(path: str | Path, triplets: Sequence[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t in triplets:
            f.write(json.dumps(t) + "\n")
    return path


def draw_triplets(rows: Sequence[dict[str, Any]], logp: torch.Tensor, rewards: torch.Tensor, k: int, seed: int,
                  tokenizer: Any) -> list[dict[str, Any]]:
    """k exact draws per training prompt from the start, scored: the triplets."""
    tokens = exact.sample(logp, k, seed)  # (P, k)
    triplets = []
    for p, (row, draws) in enumerate(zip(rows, tokens.tolist())):
        for j, token in enumerate(draws):
            triplets.append({"prompt_index": p, "sample_index": j, "prompt": row["prompt"],
                             "reference": str(row["answer"]), "completion": tokenizer.decode([token]),
                             "reward": float(rewards[p, token]), "has_eos": False,
                             "prompt_ids": list(row["_prompt_ids"]), "completion_ids": [int(token)]})
    return triplets


REQUIRED = ("prompt_index", "prompt", "completion", "reward", "prompt_ids", "completion_ids")


def read_triplets(path: str | Path) -> list[dict[str, Any]]:
    """The triplets of a JSONL file, checked: every field of `REQUIRED`, a finite reward,
    non-empty prompt and completion ids."""
    rows = []
    with Path(path).open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            missing = [k for k in REQUIRED if k not in row]
            if missing:
                raise ValueError(f"{path}:{n}: triplet without {missing}")
            if not math.isfinite(float(row["reward"])):
                raise ValueError(f"{path}:{n}: reward {row['reward']!r} is not finite")
            if not row["prompt_ids"] or not row["completion_ids"]:
                raise ValueError(f"{path}:{n}: empty prompt_ids or completion_ids")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no triplets")
    return rows


def reward_statistics(triplets: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Mean and population standard deviation of the rewards (the normalisation statistics)."""
    raw = torch.tensor([float(t["reward"]) for t in triplets], dtype=torch.float64)
    mean, std = float(raw.mean()), float(raw.std(correction=0))
    if not std > 0:
        raise ValueError(f"the {len(triplets)} training rewards are all {mean}: they cannot be normalised "
                         "(and carry no signal); sample more completions per prompt or use other prompts")
    return {"mean": mean, "std": std, "count": len(triplets)}


def _by_prompt(triplets: Sequence[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    groups: dict[Any, list[dict[str, Any]]] = {}
    for t in triplets:
        groups.setdefault(t["prompt_index"], []).append(t)
    return groups


def _by_prompt_rows(triplets: Sequence[dict[str, Any]]) -> dict[Any, list[int]]:
    """The row numbers of each prompt's triplets, prompts in order of first appearance."""
    groups: dict[Any, list[int]] = {}
    for row, t in enumerate(triplets):
        groups.setdefault(t["prompt_index"], []).append(row)
    return groups


def examples_for(triplets: Sequence[dict[str, Any]], mode: Mode, stats: dict[str, float]) -> list[dict[str, Any]]:
    """The collator examples of one mode (see the module docstring)."""
    def meta(t):
        return {"prompt": t["prompt"], "completion": t["completion"], "reward": float(t["reward"])}

    if mode == "single":
        return [{**meta(t), "_prompt_ids": t["prompt_ids"], "_completion_ids": t["completion_ids"],
                 "_reward": float(t["reward"])} for t in triplets]
    if mode == "sft":
        return [{**meta(t), "_prompt_ids": t["prompt_ids"], "_completion_ids": t["completion_ids"]}
                for t in triplets if float(t["reward"]) > stats["mean"]]
    if mode == "pairs":
        pairs = []
        for group in _by_prompt(triplets).values():
            rewards = [float(t["reward"]) for t in group]
            best = max(range(len(group)), key=lambda j: (rewards[j], -j))
            worst = min(range(len(group)), key=lambda j: (rewards[j], j))
            if rewards[best] > rewards[worst]:
                c, r = group[best], group[worst]
                pairs.append({"prompt": c["prompt"], "chosen": c["completion"], "rejected": r["completion"],
                              "_prompt_ids": c["prompt_ids"], "_chosen_ids": c["completion_ids"],
                              "_rejected_ids": r["completion_ids"]})
        return pairs
    raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")


class PromptBatchSampler:
    """Batches of whole prompt groups: each epoch shuffles the groups (with `generator`, which
    carries on across epochs as a DataLoader's does) and yields the rows of
    `prompts_per_batch` groups at a time; an incomplete last batch is dropped."""

    def __init__(self, groups: Sequence[Sequence[int]], prompts_per_batch: int, generator: torch.Generator):
        if prompts_per_batch < 1:
            raise ValueError(f"prompts_per_batch must be >= 1, got {prompts_per_batch}")
        self.groups, self.prompts_per_batch, self.generator = [list(g) for g in groups], prompts_per_batch, generator

    def __len__(self) -> int:
        return len(self.groups) // self.prompts_per_batch

    def __iter__(self):
        order = torch.randperm(len(self.groups), generator=self.generator).tolist()
        for b in range(len(self)):
            chosen = order[b * self.prompts_per_batch:(b + 1) * self.prompts_per_batch]
            yield [row for g in chosen for row in self.groups[g]]


class TripletDataModule(L.LightningDataModule):
    """A triplet JSONL -> shuffled training batches of one `mode` (`single`, `pairs`, `sft`).

    Args:
        path: the JSONL written by `write_triplets`.
        mode: which batch type (module docstring).
        pad_token_id: the tokenizer's PAD id (right padding, D5).
        batch_size: sequences per batch; `pairs` batches hold `batch_size // 2` pairs, so every
            mode trains on the same number of sequences per step.
        seed: the shuffling seed.
    Incomplete last batches are dropped (KTO's KL estimate needs at least two rows). In `single`
    mode every prompt must have the same number of draws, dividing `batch_size` (whole prompts
    per batch, `PromptBatchSampler`).
    """

    def __init__(self, path: str | Path, mode: Mode, pad_token_id: int, batch_size: int = 8, seed: int = 0):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
        self.path, self.mode, self.seed = Path(path), mode, seed
        triplets = read_triplets(self.path)
        self.reward_stats = reward_statistics(triplets)
        self.examples = examples_for(triplets, mode, self.reward_stats)
        self.batch_size = batch_size // 2 if mode == "pairs" else batch_size
        if self.batch_size < 1 or (mode == "single" and self.batch_size < 2):
            raise ValueError(f"batch_size {batch_size} is too small for mode {mode!r}")
        if len(self.examples) < self.batch_size:
            raise ValueError(f"{self.path} gives {len(self.examples)} {mode} example(s), fewer than one batch "
                             f"of {self.batch_size}: sample more prompts or completions")
        self.prompt_groups: list[list[int]] | None = None
        if mode == "single":
            self.collator = SingleCollator(pad_token_id, self.reward_stats["mean"], self.reward_stats["std"])
            self.prompt_groups = list(_by_prompt_rows(triplets).values())
            sizes = {len(g) for g in self.prompt_groups}
            if len(sizes) != 1 or self.batch_size % next(iter(sizes)):
                raise ValueError(f"{self.path}: draws per prompt {sorted(sizes)} must be one number dividing "
                                 f"batch_size {self.batch_size} (batches hold whole prompts)")
        elif mode == "pairs":
            self.collator = PreferenceCollator(pad_token_id)
        else:
            self.collator = SFTCollator(pad_token_id)

    def batch_type(self, role: str = "train") -> type:
        return self.collator.batch_type

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        if self.prompt_groups is not None:
            per_prompt = len(self.prompt_groups[0])
            sampler = PromptBatchSampler(self.prompt_groups, self.batch_size // per_prompt, generator)
            return DataLoader(self.examples, batch_sampler=sampler, collate_fn=self.collator)
        return DataLoader(self.examples, batch_size=self.batch_size, shuffle=True, drop_last=True,
                          collate_fn=self.collator, generator=generator)
