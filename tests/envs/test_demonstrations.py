"""Demonstrated episodes as SFT data (`lit_rlhf.envs.demonstrations`)."""

from __future__ import annotations

import pytest

from lit_rlhf.data.formatting import BadRow
from lit_rlhf.envs import ChatFormat, ToolEnvironment, calculator
from lit_rlhf.envs.demonstrations import DemonstrationDataModule, calculator_demonstration, play_demonstration


def test_a_demonstration_is_laid_out_as_the_rollout_lays_out_a_sampled_episode(tiny_tokenizer):
    """Prompt = the environment's first observation; each policy turn = its text's ids and EOS,
    marked; the tool's real output as the observation ids after it, unmarked."""
    tok = tiny_tokenizer
    chat = ChatFormat(tok)
    env = ToolEnvironment([calculator])
    row = {"prompt": "Ana has 3 bags of 4 apples. How many apples?", "reference": "12"}
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "3 * 4"}}</tool_call>'
    prompt, ids, policy = play_demonstration(env, chat, row, [call, "12"])
    assert prompt == chat.prompt_ids(env.reset(row, 0))
    first = chat.encode(call) + [tok.eos_token_id]
    observation = chat.observation_ids([{"role": "tool", "content": "calculator: 12"}])
    last = chat.encode("12") + [tok.eos_token_id]
    assert ids == first + observation + last
    assert policy == [True] * len(first) + [False] * len(observation) + [True] * len(last)


def test_a_demonstration_that_does_not_end_its_episode_is_a_bad_row(tiny_tokenizer):
    chat, env = ChatFormat(tiny_tokenizer), ToolEnvironment([calculator])
    row = {"prompt": "2 + 2?", "reference": "4"}
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 2"}}</tool_call>'
    with pytest.raises(BadRow, match="not done after the last"):
        play_demonstration(env, chat, row, [call])
    with pytest.raises(BadRow, match="ended after turn 1 of 2"):
        play_demonstration(env, chat, row, ["4", "4"])


def test_the_bundled_arithmetic_as_demonstrations_trains_on_the_policys_tokens_only(tiny_tokenizer):
    env = ToolEnvironment([calculator], system_prompt="Use the calculator.")
    dm = DemonstrationDataModule(environment=env, demonstration=calculator_demonstration, path="bundled:arithmetic",
                                 tokenizer=tiny_tokenizer, batch_size=4, val_split=None, test_split=None, limit=8)
    batch = next(iter(dm.train_dataloader()))
    assert batch.input_ids.shape[0] == 4
    texts = [tiny_tokenizer.decode(ids[m]) for ids, m in zip(batch.input_ids, batch.loss_mask)]
    for text, reference in zip(texts, batch.meta["reference"]):
        # the two policy turns: the call, then the answer, each closed by EOS; nothing of the tool's message
        assert text.startswith('<tool_call>{"name": "calculator", "arguments": {"expression": "')
        assert text.endswith(f"</tool_call>{tiny_tokenizer.eos_token}{reference}{tiny_tokenizer.eos_token}")
        assert "calculator: " not in text
    # the tool's output is in the sequence, as context
    full = tiny_tokenizer.decode(batch.input_ids[0][batch.attention_mask[0]])
    assert f"calculator: {batch.meta['reference'][0]}" in full


def test_calculator_demonstration_reads_the_worked_solution():
    assert calculator_demonstration({"solution": "42 / 6 = 7\n#### 7", "reference": "7"}) == [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "42 / 6"}}</tool_call>', "7"]
    with pytest.raises(BadRow, match="a op b = c"):
        calculator_demonstration({"solution": "seven\n#### 7", "reference": "7"})
