"""A policy on held-out rows of a multi-turn environment: one greedy episode per row, scored.

`evaluate_episodes` runs the rows through training's episode loop (`envs.rollout.run_episodes`)
with greedy decoding (D23), so two policies are compared deterministically, row by row, and
scores each episode as the online modules do (`OnlineModule.score_rollout`: every reward function
reads the last policy turn; the environment's return is the source `environment`). One record per
row: the conversation, the final answer, the turns, the tool calls made and failed, how the
episode stopped and each reward source's value.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from lit_rlhf.envs.base import Environment
from lit_rlhf.envs.chat import ChatFormat
from lit_rlhf.envs.rollout import run_episodes
from lit_rlhf.generation import SamplingConfig
from lit_rlhf.generation.hf import generate_responses
from lit_rlhf.rewards.sources import call_reward_fn, function_name

ENVIRONMENT = "environment"  # the source name of the environment's return, as in training


@torch.no_grad()
def evaluate_episodes(model: torch.nn.Module, tokenizer: Any, environment: Environment,
                      rows: Sequence[dict[str, Any]], reward_fns: Sequence[Callable] = (), max_turns: int = 1,
                      max_episode_tokens: int | None = None, max_new_tokens: int = 64,
                      batch_size: int = 16) -> list[dict[str, Any]]:
    """One greedy episode per row of `rows` (dicts with the environment's columns, e.g. the QA
    DataModules' `prompt` and `reference`) -> one record per row (see the module docstring).

    `max_turns`, `max_episode_tokens` (None: `max_turns * max_new_tokens`) and `max_new_tokens`
    (per turn) are the online module's settings of the same names."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    budget = max_turns * max_new_tokens if max_episode_tokens is None else int(max_episode_tokens)
    chat = ChatFormat(tokenizer)
    sampling = SamplingConfig.greedy(max_new_tokens)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    device = next(model.parameters()).device
    names: list[str] = []
    for fn in reward_fns:
        names.append(function_name(fn, [*names, ENVIRONMENT]))

    def generate(ids, mask, config):
        return (*generate_responses(model, ids, mask, config, eos, pad), None)

    envs = [environment.fork() for _ in range(min(batch_size, len(rows)))]
    records: list[dict[str, Any]] = []
    try:
        for start in range(0, len(rows), batch_size):
            chunk = [dict(r) for r in rows[start:start + batch_size]]
            # the row's own prompt ids, used only by an environment whose reset gives no observation
            row_ids = [chat.prompt_ids(str(r.get("prompt", ""))) for r in chunk]
            seeds = list(range(start, start + len(chunk)))  # fixed per row: both policies see the same
            trajectories = run_episodes(envs[:len(chunk)], chunk, seeds, row_ids, generate, chat, sampling,
                                        max_turns, budget, device=device)
            prompts = [str(r.get("prompt", "")) for r in chunk]
            completions = [t.final_text for t in trajectories]
            columns = {key: [r.get(key) for r in chunk] for key in chunk[0]}
            columns.update(completion_length=[t.num_policy_tokens for t in trajectories],
                           truncated=[t.truncated for t in trajectories], trajectory=trajectories,
                           conversation=[t.conversation(tokenizer) for t in trajectories])
            scores = {name: call_reward_fn(fn, prompts, completions, columns).tolist()
                      for name, fn in zip(names, reward_fns)}
            records += [{"prompt": prompts[i], "answer": completions[i], "conversation": columns["conversation"][i],
                         "turns": len(t.turns), "tool_calls": len(t.tool_calls),
                         "tool_errors": sum(c.error is not None for c in t.tool_calls), "stop_reason": t.stop_reason,
                         "rewards": {**{name: float(v[i]) for name, v in scores.items()}, ENVIRONMENT: t.reward}}
                        for i, t in enumerate(trajectories)]
    finally:
        for env in envs:
            env.close()
    return records
