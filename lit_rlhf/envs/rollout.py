"""The multi-turn rollout (`docs/guides/environments.md`): episodes run turn by turn, batched.

`run_episodes` resets each environment with its row and a seed from torch's generator, then each
turn samples the running episodes together from their whole context (left padded), appends the
sampled ids as they are, steps the environment on the decoded text and appends its observation's
ids. An episode stops when the environment says `done`, after `max_turns` (`turn_limit`), at
`max_episode_tokens` (`token_budget`), or at a turn without EOS (`no_eos`); all but `done` mark it
truncated. An environment that raises stops the run, or with `env_errors` drops its group. A
resumed run replays the same prompts, seeds and tokens, given an environment that is a
deterministic function of (row, seed, actions).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

import torch
from torch import Tensor

from lit_rlhf.data.collate import pad_left
from lit_rlhf.envs.base import Action, Environment, check_observation
from lit_rlhf.envs.chat import ChatFormat
from lit_rlhf.envs.errors import EnvErrorPolicy
from lit_rlhf.envs.trajectory import Trajectory

# (prompt_ids (B, P) left padded, prompt_mask (B, P), sampling) -> (response_ids (B, R),
# response_mask (B, R), has_eos (B,), sampler log-probs (B, R) or None), as `OnlineModule.generate`
GenerateFn = Callable[..., tuple[Tensor, Tensor, Tensor, "Tensor | None"]]


def run_episodes(envs: list[Environment], rows: list[dict[str, Any]], seeds: list[int],
                 row_prompt_ids: list[list[int]], generate: GenerateFn, chat: ChatFormat, sampling, max_turns: int,
                 max_episode_tokens: int, device: torch.device | str = "cpu", *, group_size: int = 1,
                 env_errors: EnvErrorPolicy | None = None) -> list[Trajectory]:
    """Run one episode per environment (see the module docstring) -> their trajectories.

    `group_size`: the episodes come in groups of this many contiguous rows (a prompt's copies).
    `env_errors`: what an environment that raises does (`lit_rlhf.envs.errors`; None: `stop`);
    with `skip`, the failing episode's group is dropped and counted on the policy, whose budget
    spans every call it is passed to."""
    if group_size < 1 or len(envs) % group_size:
        raise ValueError(f"{len(envs)} episodes do not split into groups of group_size={group_size}")
    policy = env_errors if env_errors is not None else EnvErrorPolicy()
    policy.start_rollout(len(envs))
    tokenizer = chat.tokenizer
    pad = tokenizer.pad_token_id
    failures: list[tuple[int, Exception]] = []
    trajectories = []
    for i, (env, row, seed) in enumerate(zip(envs, rows, seeds)):
        tools = tuple(getattr(env, "tool_names", ()))
        try:
            prompt = env_reset(env, row, seed, row_prompt_ids[i], chat, i)
        except Exception as err:
            if not policy.skip:
                raise
            failures.append((i, err))
            prompt = list(row_prompt_ids[i]) or [pad]  # a stand-in: the episode is dropped below
        trajectories.append(Trajectory(prompt_ids=prompt, tools=tools, group=i // group_size))
    for i, err in list(failures):
        drop_group(trajectories, i, err, group_size, policy, type(envs[i]).__name__)
    active = [i for i, t in enumerate(trajectories) if not t.dropped]
    for turn_index in range(max_turns):
        if not active:
            break
        # every running episode has room for at least one more token (an observation that
        # leaves none ends its episode below)
        budgets = [max_episode_tokens - len(trajectories[i].token_ids) for i in active]
        turn_sampling = dataclasses.replace(sampling, max_new_tokens=min(sampling.max_new_tokens, max(budgets)))
        ids, mask = pad_left([trajectories[i].prompt_ids + trajectories[i].token_ids for i in active], pad)  # D5
        ids, mask = ids.to(device), mask.to(device)
        response_ids, response_mask, has_eos, sampler_logps = generate(ids, mask, turn_sampling)
        still = []
        for j, i in enumerate(active):
            trajectory, budget = trajectories[i], budgets[j]
            if trajectory.dropped:  # another episode of its group failed earlier in this turn
                continue
            kept = response_ids[j][response_mask[j]].tolist()
            logps = None if sampler_logps is None else sampler_logps[j][response_mask[j]].tolist()
            ended = bool(has_eos[j])
            if len(kept) > budget:  # past the episode's budget: cut, and the turn never ended
                kept, logps, ended = kept[:budget], None if logps is None else logps[:budget], False
            turn = trajectory.add_policy_tokens(kept, logps)
            turn.text = tokenizer.decode(kept[:-1] if ended else kept, skip_special_tokens=False)
            if not ended:
                trajectory.truncated = True
                trajectory.stop_reason = "token_budget" if len(trajectory.token_ids) >= max_episode_tokens else "no_eos"
                continue
            try:
                result = env_step(envs[i], Action(turn.text, tuple(kept)), i)
                last = turn_index == max_turns - 1  # no turn left to read an observation
                observation = None if result.done or last else chat.observation_ids(result.observation)
            except Exception as err:
                if not policy.skip:
                    raise
                failures.append((i, err))
                drop_group(trajectories, i, err, group_size, policy, type(envs[i]).__name__)
                continue
            turn.reward, turn.tool_calls = float(result.reward), tuple(result.tool_calls)
            if result.done:
                trajectory.done, trajectory.stop_reason = True, "done"
                continue
            if last:
                trajectory.truncated, trajectory.stop_reason = True, "turn_limit"
                continue
            if len(trajectory.token_ids) + len(observation) >= max_episode_tokens:
                trajectory.truncated, trajectory.stop_reason = True, "token_budget"  # no room for a next turn
                continue
            trajectory.add_observation_tokens(observation)
            turn.observation = chat.observation_text(result.observation)
            still.append(i)
        active = [i for i in still if not trajectories[i].dropped]
    if failures:
        policy.report(type(envs[0]).__name__, [err for _, err in failures], len(envs))
    return trajectories


def env_reset(env: Environment, row: dict[str, Any], seed: int, row_prompt: list[int], chat: ChatFormat,
              index: int) -> list[int]:
    """The first prompt's token ids of an episode: `env.reset`'s observation (None: the row's
    prompt as the DataModule encoded it); an environment that raises or gives no prompt is
    reported with the row."""
    name = type(env).__name__
    try:
        observation = env.reset(row, seed)
    except Exception as err:
        raise RuntimeError(f"{name}.reset raised {type(err).__name__}: {err} on rollout row {index}") from err
    observation = check_observation(observation, f"{name}.reset (rollout row {index})")
    prompt = list(row_prompt) if observation is None else chat.prompt_ids(observation)
    if not prompt:
        raise ValueError(f"{name}.reset gave an empty first prompt (rollout row {index})")
    return prompt


def env_step(env: Environment, action: Action, row: int):
    """`env.step(action)`, its observation checked; an environment that raises is a bug in the
    environment (tool failures are observations, `lit_rlhf.envs.tools`), reported with the row."""
    try:
        result = env.step(action)
    except Exception as err:
        raise RuntimeError(f"{type(env).__name__}.step raised {type(err).__name__}: {err} on rollout row {row}, "
                           f"after the policy's turn {action.text[-300:]!r}") from err
    check_observation(result.observation, f"{type(env).__name__}.step (rollout row {row})")
    return result


def drop_group(trajectories: list[Trajectory], index: int, error: Exception, group_size: int,
               policy: EnvErrorPolicy, environment: str) -> None:
    """Episode `index` failed: mark it and every episode of its group dropped (those still
    running stop), and count it on `policy` (which raises past its budget)."""
    first = index - index % group_size
    group = trajectories[first:first + group_size]
    new_group = not any(t.dropped for t in group)
    failed = trajectories[index]
    failed.error, failed.stop_reason, failed.truncated = f"{type(error).__name__}: {error}", "env_error", True
    for t in group:
        t.dropped = True
        if not (t.done or t.truncated):
            t.truncated, t.stop_reason = True, "dropped"
    policy.record(environment, error, new_group)


def environment_stats(trajectories: list[Trajectory], tools: Iterable[str] = ()) -> dict[str, Tensor]:
    """What a researcher reads about a batch of episodes (`rollout/...`: per-episode means, failed
    episodes, dropped groups, each tool's calls and errors and their totals; `unparsed` counts
    malformed calls, `unknown_tool` calls of no tool). Every tool offered is logged in every rollout,
    0 when not called, so a logger never shows a previous rollout's count."""
    n = max(len(trajectories), 1)
    stats = {
        "rollout/turns": sum(len(t.turns) for t in trajectories) / n,
        "rollout/done_fraction": sum(t.done for t in trajectories) / n,
        "rollout/truncated_fraction": sum(t.truncated for t in trajectories) / n,
        "rollout/policy_tokens": sum(t.num_policy_tokens for t in trajectories) / n,
        "rollout/env_tokens": sum(t.num_env_tokens for t in trajectories) / n,
        "rollout/env_reward": sum(t.reward for t in trajectories) / n,
        "rollout/env_errors": sum(bool(t.error) for t in trajectories),
        "rollout/dropped_groups": len({t.group for t in trajectories if t.dropped}),
    }
    offered = set(tools).union(*(t.tools for t in trajectories))
    if offered:
        offered |= {"unparsed", "unknown_tool"}
    calls: dict[str, list[int]] = {name: [0, 0] for name in offered}
    for t in trajectories:
        for call in t.tool_calls:  # a name the policy made up is not a metric of its own
            name = {"parse": "unparsed", "unknown_tool": "unknown_tool"}.get(call.error or "", call.name)
            counts = calls.setdefault(name, [0, 0])
            counts[0] += 1
            counts[1] += call.error is not None
    for name, (made, failed) in sorted(calls.items()):
        stats[f"rollout/tool_calls/{name}"] = made
        stats[f"rollout/tool_errors/{name}"] = failed
    stats["rollout/tool_calls"] = sum(c[0] for c in calls.values())
    stats["rollout/tool_errors"] = sum(c[1] for c in calls.values())
    return {k: torch.tensor(float(v)) for k, v in stats.items()}
