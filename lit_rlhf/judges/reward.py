"""A judge that prefers the completion a reward function scores higher."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch import Tensor

from lit_rlhf.judges.base import Judgement, PairwiseJudge, check_lengths

RewardFn = Callable[[list[str], list[str]], "Tensor | Sequence[float]"]


class RewardModelJudge(PairwiseJudge):
    """Winner = the completion with the higher reward; equal rewards are a tie, a non-finite one
    makes the item invalid. `reward_fn(prompts, completions) -> N floats` is called once per
    `judge` call on the 2N texts (all a's, then all b's); nothing is shuffled. `raw` is
    "reward_a=<r_a> reward_b=<r_b>"."""

    def __init__(self, reward_fn: RewardFn) -> None:
        if not callable(reward_fn):
            raise TypeError(f"reward_fn must be callable, got {type(reward_fn).__name__}")
        self.reward_fn = reward_fn

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reward_fn={self.reward_fn!r})"

    def judge(self, prompts: list[str], completions_a: list[str], completions_b: list[str]) -> list[Judgement]:
        n = check_lengths(prompts, completions_a, completions_b)
        if n == 0:
            return []
        rewards = self.reward_fn(list(prompts) + list(prompts), list(completions_a) + list(completions_b))
        rewards = torch.as_tensor(rewards, dtype=torch.float64).detach().cpu().reshape(-1).tolist()
        if len(rewards) != 2 * n:
            raise ValueError(f"reward_fn returned {len(rewards)} rewards for {2 * n} completions")
        out = []
        for r_a, r_b in zip(rewards[:n], rewards[n:]):
            raw = f"reward_a={r_a!r} reward_b={r_b!r}"
            if not (math.isfinite(r_a) and math.isfinite(r_b)):
                out.append(Judgement("invalid", raw=raw, error="non-finite reward"))
            else:
                out.append(Judgement("a" if r_a > r_b else "b" if r_b > r_a else "tie", raw=raw))
        return out

    @classmethod
    def from_pretrained(cls, model_dir: str, **kwargs) -> "RewardModelJudge":
        """A judge on a reward model exported as `AutoModelForSequenceClassification` (num_labels=1);
        `kwargs`: `SequenceClassifierReward`'s."""
        return cls(SequenceClassifierReward(model_dir, **kwargs))


class SequenceClassifierReward:
    """reward_fn over a Hugging Face sequence-classification reward model (num_labels=1): scores
    `prompt + completion` (+ EOS with `append_eos`: the reward is read at the EOS, D12, D3), right
    padded, in batches of `batch_size`; the tokenizer is `tokenizer_name`, else the model's own."""

    def __init__(self, model_dir: str, tokenizer_name: str | None = None, batch_size: int = 8, append_eos: bool = True,
                 device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None) -> None:
        from transformers import AutoModelForSequenceClassification

        from lit_rlhf.models import disable_dropout, load_tokenizer

        self.model_dir = str(model_dir)
        self.batch_size = int(batch_size)
        self.append_eos = append_eos
        self.device = torch.device(device)
        self.tokenizer = load_tokenizer(tokenizer_name or self.model_dir, padding_side="right")
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        model = AutoModelForSequenceClassification.from_pretrained(self.model_dir, dtype=dtype or torch.float32)
        if model.config.num_labels != 1:
            raise ValueError(f"{self.model_dir} has num_labels={model.config.num_labels}; a reward model has 1")
        model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model = disable_dropout(model).to(self.device).eval()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_dir={self.model_dir!r}, batch_size={self.batch_size})"

    @torch.no_grad()
    def __call__(self, prompts: list[str], completions: list[str]) -> Tensor:
        eos = self.tokenizer.eos_token
        texts = [p + c for p, c in zip(prompts, completions)]
        if self.append_eos:
            texts = [t if t.endswith(eos) else t + eos for t in texts]
        scores = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[start : start + self.batch_size], padding=True, return_tensors="pt")
            enc = {k: v.to(self.device) for k, v in enc.items()}
            scores.append(self.model(**enc).logits[:, 0].float().cpu())  # (b,)
        return torch.cat(scores) if scores else torch.zeros(0)
