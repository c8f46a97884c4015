"""An environment that raises: `stop` ends the run, `skip` drops the episode's group within a budget."""

from __future__ import annotations

import logging

import pytest
import torch

from lit_rlhf.envs import ChatFormat
from lit_rlhf.envs.errors import EnvErrorBudgetExceeded, EnvErrorPolicy
from lit_rlhf.envs.rollout import environment_stats, run_episodes
from lit_rlhf.envs.trajectory import to_tensors
from lit_rlhf.generation import SamplingConfig
from tests.envs.test_rollout import ScriptedPolicy
from tests.envs.turn_envs import FlakyEnv

GROUP = 2


def rollout(tokenizer, fail_at: dict[int, int], env_errors=None, rows: int = 6):
    """`rows` episodes of `FlakyEnv` (3 turns each) in groups of 2; row i's step raises at turn
    `fail_at[i]` (its reset when 0)."""
    envs = [FlakyEnv(3, prompt_column="prompt") for _ in range(rows)]
    meta = [{"prompt": f"row {i}", "fail_at": fail_at.get(i)} for i in range(rows)]
    return run_episodes(envs, meta, list(range(rows)), [[0]] * rows, ScriptedPolicy(tokenizer, ["hello there"]),
                        ChatFormat(tokenizer), SamplingConfig(max_new_tokens=20), max_turns=3, max_episode_tokens=400,
                        group_size=GROUP, env_errors=env_errors)


def test_stop_raises_naming_the_environment_and_row(tiny_tokenizer):
    with pytest.raises(RuntimeError, match=r"FlakyEnv.step raised ValueError: boom at turn 2 on rollout row 3"):
        rollout(tiny_tokenizer, {3: 2})
    with pytest.raises(RuntimeError, match=r"FlakyEnv.reset raised ConnectionError: .* on rollout row 1"):
        rollout(tiny_tokenizer, {1: 0}, EnvErrorPolicy("stop"))


def test_skip_drops_the_failing_episodes_group(tiny_tokenizer, caplog):
    policy = EnvErrorPolicy("skip", max_env_errors=5)
    with caplog.at_level(logging.WARNING, logger="lit_rlhf.envs.errors"):
        trajectories = rollout(tiny_tokenizer, {3: 2, 4: 0}, policy)  # group 1 fails mid-episode, group 2 at reset
    assert "FlakyEnv: 2 of 6 episodes of this rollout failed" in caplog.text and len(caplog.records) == 1
    assert "the last: RuntimeError: FlakyEnv.step raised ValueError: boom at turn 2 on rollout row 3" in caplog.text
    assert [t.dropped for t in trajectories] == [False, False, True, True, True, True]
    assert [t.stop_reason for t in trajectories] == ["done", "done", "dropped", "env_error", "env_error", "dropped"]
    assert "boom at turn 2" in trajectories[3].error and "ConnectionError" in trajectories[4].error
    assert len(trajectories[3].turns) == 2 and len(trajectories[4].turns) == 0  # stopped where it failed
    assert [len(t.turns) for t in trajectories[:2]] == [3, 3]  # the other groups ran to the end
    assert all(t.reward == 0.0 for t in trajectories[2:])

    t = to_tensors(trajectories, 400, tiny_tokenizer.pad_token_id)
    assert t.dropped.tolist() == [False, False, True, True, True, True]
    assert t.action_mask[:2].any(dim=1).all() and not t.action_mask[2:].any()  # no policy token to train on
    assert t.response_mask[2:4].any(dim=1).all()  # the tokens stay as context
    assert not t.turn_rewards[2:].any() and torch.isfinite(t.turn_rewards).all()
    assert t.has_eos.tolist() == [True, True, False, False, False, False]

    stats = {k: float(v) for k, v in environment_stats(trajectories).items()}
    assert stats["rollout/env_errors"] == 2 and stats["rollout/dropped_groups"] == 2
    assert (policy.errors, policy.dropped_groups, policy.episodes) == (2, 2, 6)
    clean = {k: float(v) for k, v in environment_stats(rollout(tiny_tokenizer, {}, policy)).items()}
    assert clean["rollout/env_errors"] == 0 and clean["rollout/dropped_groups"] == 0  # logged as 0, never stale


def test_two_failures_in_one_group_drop_it_once(tiny_tokenizer):
    policy = EnvErrorPolicy("skip", max_env_errors=5)
    trajectories = rollout(tiny_tokenizer, {0: 1, 1: 2}, policy)
    assert [t.stop_reason for t in trajectories[:2]] == ["env_error", "dropped"]  # row 1 stopped with row 0
    assert (policy.errors, policy.dropped_groups) == (1, 1)
    trajectories = rollout(tiny_tokenizer, {0: 1, 1: 1}, policy)  # both fail in the same turn
    assert [t.stop_reason for t in trajectories[:2]] == ["env_error", "dropped"]
    assert (policy.errors, policy.dropped_groups) == (2, 2)


def test_the_budget_spans_the_run_and_stops_it_with_the_last_error(tiny_tokenizer):
    policy = EnvErrorPolicy("skip", max_env_errors=2)
    rollout(tiny_tokenizer, {3: 2}, policy)
    rollout(tiny_tokenizer, {0: 1}, policy)  # 2 failures over the run: the budget
    with pytest.raises(EnvErrorBudgetExceeded, match=r"FlakyEnv: 3 episodes failed \(3 of 18 episodes run\).*"
                                                     r"max_env_errors=2.*boom at turn 3 on rollout row 5") as info:
        rollout(tiny_tokenizer, {5: 3}, policy)
    assert isinstance(info.value.__cause__, RuntimeError)

    share = EnvErrorPolicy("skip", max_env_errors=0.2)  # 20% of the episodes so far, never fewer than 1
    rollout(tiny_tokenizer, {2: 1}, share)  # 1 of 6: allowed (1.2)
    with pytest.raises(EnvErrorBudgetExceeded, match=r"3 episodes failed \(3 of 12 episodes run\).*0.2 of 12"):
        rollout(tiny_tokenizer, {0: 1, 4: 1}, share)  # 3 of 12: past 2.4


def test_policy_arguments_are_checked():
    for bad in ("ignore", "raise"):
        with pytest.raises(ValueError, match="on_env_error must be 'stop' or 'skip'"):
            EnvErrorPolicy(bad)
    for bad, error in ((-1, ValueError), (1.5, ValueError), (0.0, ValueError), (True, TypeError), ("3", TypeError)):
        with pytest.raises(error, match="max_env_errors"):
            EnvErrorPolicy("skip", bad)
    with pytest.raises(ValueError, match="group_size=4"):
        run_episodes([FlakyEnv()] * 6, [{}] * 6, [0] * 6, [[0]] * 6, None, None, None, 1, 10, group_size=4)
    policy = EnvErrorPolicy("skip", 3)
    policy.record("Env", ValueError("x"), True)
    restored = EnvErrorPolicy("skip", 3)
    restored.load_state_dict(policy.state_dict())
    assert (restored.errors, restored.dropped_groups) == (1, 1)


def one(prompts, completions, **columns):
    """A reward of 1 for every completion, an empty one too."""
    return [1.0] * len(completions)


def test_grpo_with_skip_trains_on_the_other_groups_and_checkpoints_the_counts():
    """Through the module: a prompt whose episode raises loses its whole group (no policy token,
    every reward source 0, advantages 0), the other prompt's group trains, and the counts travel
    in the source's checkpoint state."""
    from lit_rlhf.data.collate import PromptCollator
    from lit_rlhf.modules import GRPOModule
    from lit_rlhf.online import EnvironmentRollouts

    torch.manual_seed(0)
    source = EnvironmentRollouts(FlakyEnv(3, prompt_column="prompt"), max_turns=3, max_episode_tokens=64,
                                 on_env_error="skip", max_env_errors=4)
    module = GRPOModule(model="tiny-random-llama", rollout=source, reward_fns=[one],
                        max_new_tokens=6, num_generations=2, kl_coef=0.0, log_completions_every_n_steps=0)
    tok = module.tokenizer
    rows = [{"_prompt_ids": tok(p, add_special_tokens=False)["input_ids"], "prompt": p, "fail_at": f}
            for p, f in (("fine", None), ("flaky", 0))]  # 0: its reset raises
    rollout, per_source, _ = module.make_rollout(PromptCollator(tok.pad_token_id)(rows), repeats=2)
    assert rollout.loss_mask[2:].sum() == 0 and rollout.loss_mask[:2].sum() > 0  # the flaky prompt's group
    assert all(float(v[2:].abs().sum()) == 0 for v in per_source.values()) and float(rollout.scores[2:].abs().sum()) == 0
    source = module.rollout_source  # the module's own copy of the source it was given
    assert source.env_errors.errors == 2 and source.env_errors.dropped_groups == 1  # both copies raised
    state = source.state_dict()
    fresh = EnvironmentRollouts(FlakyEnv(3), on_env_error="skip", max_env_errors=4)
    fresh.load_state_dict(state)
    assert fresh.env_errors.state_dict() == state["env_errors"]


def environment(prompts, completions, **columns):
    """A reward function that happens to carry the environment source's name."""
    return [0.5] * len(completions)


def test_a_reward_function_named_environment_keeps_its_reward_beside_the_environments_return():
    from lit_rlhf.data.collate import PromptCollator
    from lit_rlhf.modules import GRPOModule
    from lit_rlhf.online import EnvironmentRollouts

    torch.manual_seed(0)
    source = EnvironmentRollouts(FlakyEnv(3, prompt_column="prompt"), max_turns=3, max_episode_tokens=64)
    module = GRPOModule(model="tiny-random-llama", rollout=source, reward_fns=[environment], max_new_tokens=6,
                        num_generations=2, kl_coef=0.0, log_completions_every_n_steps=0)
    tok = module.tokenizer
    rows = [{"_prompt_ids": tok("fine", add_special_tokens=False)["input_ids"], "prompt": "fine", "fail_at": None}]
    _, per_source, _ = module.make_rollout(PromptCollator(tok.pad_token_id)(rows), repeats=2)
    assert list(per_source) == ["environment_", "environment"]
    assert per_source["environment_"].tolist() == [0.5, 0.5]
