"""The multi-turn rollout: tokens kept as sampled, the policy-token mask, budgets, hostile tools."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.envs import ChatFormat, ToolEnvironment, calculator
from lit_rlhf.envs.rollout import environment_stats, run_episodes
from lit_rlhf.envs.trajectory import to_tensors
from lit_rlhf.generation import SamplingConfig, generate_responses
from tests.envs import hostile_tools as hostile
from tests.envs.turn_envs import CountingEnv

pytestmark = pytest.mark.usefixtures("one_thread")


def recording_sampler(model, tokenizer):
    """The hf backend as the online modules call it, recording each call's (context, sampled ids)."""
    calls = []

    def generate(ids, mask, sampling):
        out = generate_responses(model, ids, mask, sampling, tokenizer.eos_token_id, tokenizer.pad_token_id)
        calls.append((ids, mask, out[0], out[1]))
        return (*out, None)

    return generate, calls


def test_episode_tokens_are_the_sampled_ids_and_the_mask_marks_them(eos_prone_tiny, tiny_tokenizer):
    """Each episode, rebuilt by hand from what the sampler returned and what the chat format
    gives for each observation, is exactly the trajectory: the policy's ids as sampled (never
    decoded and encoded again: for some turn that would give other ids), the observation ids
    after them, `action_mask` True on the policy's ids only, each turn's reward on its last
    policy token."""
    tok = tiny_tokenizer
    torch.manual_seed(0)
    generate, calls = recording_sampler(eos_prone_tiny, tok)
    chat = ChatFormat(tok)
    envs = [CountingEnv(3, prompt_column="prompt") for _ in range(4)]
    rows = [{"prompt": f"say {i}"} for i in range(4)]
    trajectories = run_episodes(envs, rows, [0, 1, 2, 3], [[0]] * 4, generate, chat, SamplingConfig(max_new_tokens=8),
                                max_turns=3, max_episode_tokens=200)
    # rebuild each episode from the sampler's calls: the episodes still running are its rows, in order
    expected = {i: [] for i in range(4)}
    expected_mask = {i: [] for i in range(4)}
    running = list(range(4))
    observation = chat.observation_ids([{"role": "user", "content": "turn {k} of 3: go on"}])  # per turn below
    for turn, (ids, mask, sampled, sampled_mask) in enumerate(calls):
        nxt = []
        for j, i in enumerate(running):
            # the context the sampler got is the prompt and the episode so far, as kept
            assert ids[j][mask[j]].tolist() == trajectories[i].prompt_ids + expected[i]
            kept = sampled[j][sampled_mask[j]].tolist()
            expected[i] += kept
            expected_mask[i] += [True] * len(kept)
            t = trajectories[i]
            if len(t.turns) > turn + 1:  # the episode went on: the observation's ids follow
                observation = chat.observation_ids([{"role": "user", "content": f"turn {turn + 1} of 3: go on"}])
                expected[i] += observation
                expected_mask[i] += [False] * len(observation)
                nxt.append(i)
        running = nxt
    retokenized_differs = False
    for i, t in enumerate(trajectories):
        assert t.token_ids == expected[i] and t.policy_mask == expected_mask[i]
        assert t.prompt_ids == chat.prompt_ids([{"role": "user", "content": f"say {i}"}])
        for turn in t.turns:
            policy_ids = t.token_ids[turn.start:turn.end]
            again = tok(tok.decode(policy_ids), add_special_tokens=False)["input_ids"]
            retokenized_differs |= again != policy_ids
    assert retokenized_differs  # decoding and encoding again would have changed what was sampled
    assert max(len(t.turns) for t in trajectories) >= 2  # multi-turn episodes happened
    tensors = to_tensors(trajectories, 200, tok.pad_token_id)
    for i, t in enumerate(trajectories):
        r = len(t.token_ids)
        assert tensors.response_ids[i, :r].tolist() == t.token_ids
        assert tensors.response_mask[i].tolist() == [True] * r + [False] * (200 - r)
        assert tensors.action_mask[i, :r].tolist() == t.policy_mask and not tensors.action_mask[i, r:].any()
        ends = {turn.end - 1: turn.reward for turn in t.turns}
        assert tensors.turn_rewards[i].tolist() == pytest.approx([ends.get(c, 0.0) for c in range(200)])
        assert bool(tensors.has_eos[i]) == (t.stop_reason == "done")


def test_budgets_truncate_and_flag_episodes(eos_prone_tiny, tiny_tokenizer):
    torch.manual_seed(1)
    generate, _ = recording_sampler(eos_prone_tiny, tiny_tokenizer)
    chat = ChatFormat(tiny_tokenizer)
    # a budget of 30 tokens: the first observation (38 tokens with the tiny byte-level tokenizer) never fits
    trajectories = run_episodes([CountingEnv(3, prompt_column="prompt") for _ in range(4)], [{"prompt": "go"}] * 4,
                                [0] * 4, [[0]] * 4, generate, chat, SamplingConfig(max_new_tokens=8), 3, 30)
    for t in trajectories:
        assert t.truncated and not t.done and len(t.token_ids) <= 30
        assert t.stop_reason in ("token_budget", "no_eos") and t.num_env_tokens == 0
    # one turn allowed: episodes that ended their turn stop at the turn limit
    trajectories = run_episodes([CountingEnv(3, prompt_column="prompt") for _ in range(4)], [{"prompt": "go"}] * 4,
                                [0] * 4, [[0]] * 4, generate, chat, SamplingConfig(max_new_tokens=8), 1, 200)
    assert {t.stop_reason for t in trajectories} <= {"turn_limit", "no_eos"}
    assert all(t.truncated and len(t.turns) == 1 for t in trajectories)
    assert to_tensors(trajectories, 200, tiny_tokenizer.pad_token_id).has_eos.sum() == 0


class ScriptedPolicy:
    """Samples the token ids of given turn texts (then EOS), in order, for every row: drives the
    rollout through tool calls a tiny random model would never write."""

    def __init__(self, tokenizer, turns: list[str]) -> None:
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0

    def __call__(self, ids, mask, sampling):
        text = self.turns[min(self.calls, len(self.turns) - 1)]
        self.calls += 1
        tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        n = ids.shape[0]
        out = torch.full((n, sampling.max_new_tokens), self.tokenizer.pad_token_id)
        out[:, :len(tokens)] = torch.tensor(tokens[:sampling.max_new_tokens])
        from lit_rlhf.generation import finish_responses

        return (*finish_responses(out, sampling.max_new_tokens, self.tokenizer.eos_token_id,
                                  self.tokenizer.pad_token_id), None)


def test_hostile_tools_become_error_observations_and_are_counted(tiny_tokenizer):
    tok = tiny_tokenizer
    call = '<tool_call>{{"name": "{}", "arguments": {}}}</tool_call>'
    turns = [
        call.format("explode", '{"text": "x"}') + call.format("hang", '{"seconds": 30}'),  # raises; hangs
        call.format("garbage", '{"n": 1}') + call.format("add", '{"a": "two", "b": 1}'),  # garbage; bad arguments
        call.format("teleport", "{}") + '<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>',  # unknown; malformed
        call.format("add", '{"a": 40, "b": 2}'),  # a good call
        "The answer is 42.",
    ]
    env = ToolEnvironment([hostile.add, hostile.explode, hostile.hang, hostile.garbage, calculator], timeout=0.2,
                          error_reward=-0.5)
    policy = ScriptedPolicy(tok, turns)
    [trajectory] = run_episodes([env], [{"prompt": "What is 40 + 2?"}], [0], [[0]], policy, ChatFormat(tok),
                                SamplingConfig(max_new_tokens=400), max_turns=6, max_episode_tokens=4000)
    assert trajectory.done and trajectory.stop_reason == "done" and len(trajectory.turns) == 5
    errors = [(c.name, c.error) for c in trajectory.tool_calls]
    assert errors == [("explode", "raised"), ("hang", "timeout"), ("garbage", "bad_output"), ("add", "bad_arguments"),
                      ("teleport", "unknown_tool"), ("<unparsed>", "parse"), ("add", None)]
    assert "error:" in trajectory.turns[0].observation and "42" in trajectory.turns[3].observation
    assert [t.reward for t in trajectory.turns] == [-1.0, -1.0, -1.0, 0.0, 0.0]
    stats = {k: float(v) for k, v in environment_stats([trajectory]).items()}
    assert stats["rollout/tool_errors/explode"] == 1 and stats["rollout/tool_errors/hang"] == 1
    assert stats["rollout/tool_errors/add"] == 1 and stats["rollout/tool_calls/add"] == 2
    assert stats["rollout/tool_errors/unknown_tool"] == 1 and stats["rollout/tool_errors/unparsed"] == 1
    assert stats["rollout/tool_errors"] == 6 and stats["rollout/tool_calls"] == 7 and stats["rollout/turns"] == 5


def test_tool_text_with_lone_surrogates_in_an_episode(tiny_tokenizer):
    """A tool whose output holds undecodable bytes: the episode runs on, the observation has
    U+FFFD in their place."""
    call = '<tool_call>{"name": "undecodable", "arguments": {"n": 1}}</tool_call>'
    env = ToolEnvironment([hostile.undecodable])
    policy = ScriptedPolicy(tiny_tokenizer, [call, "ok"])
    [trajectory] = run_episodes([env], [{"prompt": "read it"}], [0], [[0]], policy, ChatFormat(tiny_tokenizer),
                                SamplingConfig(max_new_tokens=200), max_turns=3, max_episode_tokens=2000)
    assert trajectory.done and [c.error for c in trajectory.tool_calls] == [None]
    assert "read: \ufffd\ufffd ok" in trajectory.turns[0].observation
    assert "\ufffd\ufffd ok" in trajectory.conversation(tiny_tokenizer)


def test_tool_counts_are_per_rollout(tiny_tokenizer):
    """A tool the policy did not call in a rollout is logged with 0 calls, not left out (a
    logger would keep showing its previous value), and the per-tool counts add up to the totals."""
    call = '<tool_call>{{"name": "{}", "arguments": {}}}</tool_call>'
    env = ToolEnvironment([hostile.add, hostile.explode, calculator])
    stats = []
    for turn in (call.format("add", '{"a": 1, "b": 2}') + call.format("explode", '{"text": "x"}'),
                 call.format("calculator", '{"expression": "1 +"}')):
        trajectories = run_episodes([env.fork(), env.fork()], [{"prompt": "go"}] * 2, [0, 1], [[0]] * 2,
                                    ScriptedPolicy(tiny_tokenizer, [turn, "done"]), ChatFormat(tiny_tokenizer),
                                    SamplingConfig(max_new_tokens=200), max_turns=2, max_episode_tokens=2000)
        stats.append({k: float(v) for k, v in environment_stats(trajectories).items()})
    first, second = stats
    assert first["rollout/tool_calls/add"] == 2 and first["rollout/tool_errors/explode"] == 2
    assert first["rollout/tool_calls/calculator"] == 0
    assert second["rollout/tool_calls/calculator"] == 2 and second["rollout/tool_errors/calculator"] == 2
    for name in ("add", "explode", "unparsed", "unknown_tool"):
        assert second[f"rollout/tool_calls/{name}"] == 0 and second[f"rollout/tool_errors/{name}"] == 0
    for s in stats:
        for kind in ("tool_calls", "tool_errors"):
            assert s[f"rollout/{kind}"] == sum(v for k, v in s.items() if k.startswith(f"rollout/{kind}/"))
