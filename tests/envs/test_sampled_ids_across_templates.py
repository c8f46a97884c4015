"""The ids the loss trains on are the ids the engine sampled, turn by turn, whatever the chat
template does: the bundled tokenizers' templates (the tiny test tokenizer's, SmolLM2's) and a
template that strips earlier turns' `<think>` blocks (as Qwen3's does). The policy samples ids no
tokenizer would produce from the text (a non-canonical split, a reasoning block): re-rendering
the conversation would give other ids, and the trajectory keeps the sampled ones."""

from __future__ import annotations

import copy

import pytest
import torch

from lit_rlhf.envs import ChatFormat
from lit_rlhf.envs.rollout import run_episodes
from lit_rlhf.envs.trajectory import to_tensors
from lit_rlhf.generation import SamplingConfig, finish_responses
from tests.envs.turn_envs import CountingEnv

# ChatML that drops the reasoning of every assistant turn but the last one
THINK_STRIPPING = (
    "{% for m in messages %}{% set c = m['content'] %}"
    "{% if m['role'] == 'assistant' and not loop.last %}{% set c = c.split('</think>')[-1].lstrip() %}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + c + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


class SplitSampler:
    """Samples each turn's text one character at a time (ids a tokenizer would merge, the text of a
    special token among them), then the turn close and EOS; records the sampled ids of each call."""

    def __init__(self, tokenizer, chat: ChatFormat) -> None:
        self.tokenizer, self.calls = tokenizer, []
        self.close = "" if chat._turn_suffix.strip() == "" and tokenizer.eos_token == "<|im_end|>" else "<|im_end|>"

    def __call__(self, ids, mask, sampling):
        text = f"<think>step {len(self.calls)}: <|im_start|>hmm</think>answer {len(self.calls)}"
        pieces = [self.tokenizer(c, add_special_tokens=False)["input_ids"] for c in text]
        tokens = [i for p in pieces for i in p] + self.tokenizer(self.close, add_special_tokens=False)["input_ids"]
        tokens += [self.tokenizer.eos_token_id]
        out = torch.full((ids.shape[0], sampling.max_new_tokens), self.tokenizer.pad_token_id)
        out[:, :len(tokens)] = torch.tensor(tokens)
        self.calls.append(tokens)
        return (*finish_responses(out, sampling.max_new_tokens, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id),
                None)


@pytest.mark.parametrize("name", ["tiny", "smollm2", "think-stripping"])
def test_trained_ids_are_the_sampled_ids_turn_by_turn(name, tiny_tokenizer, smollm2_tokenizer):
    tokenizer = tiny_tokenizer if name == "tiny" else copy.deepcopy(smollm2_tokenizer)
    if name == "think-stripping":
        tokenizer.chat_template = THINK_STRIPPING
    chat = ChatFormat(tokenizer)
    sampler = SplitSampler(tokenizer, chat)
    envs = [CountingEnv(3, prompt_column="prompt") for _ in range(2)]
    trajectories = run_episodes(envs, [{"prompt": "go"}] * 2, [0, 1], [[0]] * 2, sampler, chat,
                                SamplingConfig(max_new_tokens=64), max_turns=3, max_episode_tokens=600)
    tensors = to_tensors(trajectories, 600, tokenizer.pad_token_id)
    for i, t in enumerate(trajectories):
        assert t.stop_reason == "done" and len(t.turns) == 3
        trained = tensors.response_ids[i][tensors.action_mask[i]].tolist()
        assert trained == [x for turn in sampler.calls for x in turn]  # every policy token the loss sees
        for k, turn in enumerate(t.turns):  # turn by turn, in place
            assert tensors.response_ids[i, turn.start:turn.end].tolist() == sampler.calls[k]
            assert tensors.action_mask[i, turn.start:turn.end].all() and not tensors.action_mask[i, turn.end:turn.observation_end].any()
    # the same conversation rendered again by the template: other ids for the policy's turns
    # (merged characters; the think-stripping template also drops the first turns' reasoning)
    turns = [tokenizer.decode(c[:-1], skip_special_tokens=True) for c in sampler.calls]
    messages = [{"role": "user", "content": "go"}]
    for k, text in enumerate(turns):
        messages.append({"role": "assistant", "content": text})
        if k < 2:
            messages.append({"role": "user", "content": f"turn {k + 1} of 3: go on"})
    rendered = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    sampled_episode = trajectories[0].prompt_ids + trajectories[0].token_ids
    assert rendered != sampled_episode
    stripped = "step 0" not in tokenizer.decode(rendered)
    assert stripped == (name == "think-stripping")
    assert "step 0" in tokenizer.decode(sampled_episode)  # the trajectory kept the turn as sampled
