"""Observations as appended token ids (chat templates), and an OpenEnv environment in-process."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from lit_rlhf.envs import Action, ChatFormat, ToolEnvironment, calculator
from tests.envs import hostile_tools as hostile


def check_observation_continues_template(tokenizer):
    tool = [{"role": "tool", "content": "calculator: 5"}]
    chat = ChatFormat(tokenizer)
    messages = [{"role": "user", "content": "2+3?"}]
    prompt = chat.prompt_text(messages)
    eos = tokenizer.eos_token
    turn = "<tool_call>{}</tool_call>" + ("" if eos == "<|im_end|>" else "<|im_end|>") + eos
    whole = tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": "<tool_call>{}</tool_call>"}] + tool,
        tokenize=False, add_generation_prompt=True)
    appended = prompt + turn + chat.observation_text(tool)
    assert appended.replace(eos, "" if eos != "<|im_end|>" else eos) == whole
    ids = chat.observation_ids(tool)
    assert tokenizer.decode(ids) == chat.observation_text(tool)
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") in ids  # special text -> special token


def test_observation_continues_the_chat_template(tiny_tokenizer):
    """The policy's turn + the observation's text is what the template renders for the whole
    conversation. The tiny tokenizer's EOS `</s>` is not the template's turn end, so the policy
    writes `<|im_end|>` itself."""
    check_observation_continues_template(tiny_tokenizer)


@pytest.mark.slow
def test_observation_continues_smollm2_chat_template(smollm2_tokenizer):
    """SmolLM2's EOS is the template's turn end `<|im_end|>`: the observation starts after it."""
    check_observation_continues_template(smollm2_tokenizer)


def test_text_with_lone_surrogates_becomes_encodable_tokens(tiny_tokenizer):
    """An environment's text with lone surrogates (undecodable bytes read as text) is encoded
    with U+FFFD in their place, in the chat format and the plain one, prompts and observations."""
    bad = "out: " + b"\xff".decode("utf-8", "surrogateescape") + " \ud800"
    plain = copy.deepcopy(tiny_tokenizer)
    plain.chat_template = None
    for chat in (ChatFormat(tiny_tokenizer), ChatFormat(plain)):
        for observation in ([{"role": "tool", "content": bad}], bad):
            text = chat.observation_text(observation)
            assert "\udcff" not in text and "out: \ufffd \ufffd" in text
            assert tiny_tokenizer.decode(chat.observation_ids(observation)) == text
        assert "out: \ufffd \ufffd" in chat.prompt_text([{"role": "user", "content": bad}])
    assert ChatFormat(tiny_tokenizer).prompt_ids([{"role": "user", "content": bad}])


def test_tool_environment_episode():
    env = ToolEnvironment([calculator, hostile.explode], max_calls_per_turn=2, error_reward=-0.1)
    first = env.reset({"prompt": "What is 6 times 7?"}, seed=0)
    assert [m["role"] for m in first] == ["system", "user"] and first[1]["content"] == "What is 6 times 7?"
    assert '"name": "calculator"' in first[0]["content"] and "<tool_call>" in first[0]["content"]
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    bad = '<tool_call>{"name": "explode", "arguments": {"txt": 1}}</tool_call>'
    result = env.step(Action(call + bad + call))
    assert not result.done and result.reward == pytest.approx(-0.1)
    assert [c.error for c in result.tool_calls] == [None, "bad_arguments"]
    assert result.observation[0] == {"role": "tool", "content": "calculator: 42"}
    assert "at most 2 tool calls" in result.observation[-1]["content"]
    final = env.step(Action("The answer is 42."))
    assert final.done and final.observation is None and final.reward == 0.0
    with pytest.raises(KeyError, match="'question'"):
        ToolEnvironment([calculator], prompt_column="question").reset({"prompt": "x"}, seed=0)


def _guess_env_class():
    """A small OpenEnv environment (typed pydantic action and observation, a server-side
    `Environment` subclass): guess a secret number from 1 to 10 drawn from the reset seed."""
    from openenv.core.env_server import Action as OAction
    from openenv.core.env_server import Environment as OEnvironment
    from openenv.core.env_server import Observation as OObservation
    from openenv.core.env_server import State

    class GuessAction(OAction):
        message: str

    class GuessObservation(OObservation):
        hint: str = ""

    class GuessEnv(OEnvironment[GuessAction, GuessObservation, State]):
        def __init__(self) -> None:
            super().__init__()
            self.secret, self._state = 0, State()

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
            self.secret, self._state = random.Random(seed).randint(1, 10), State(episode_id=episode_id)
            return GuessObservation(hint="Guess a number from 1 to 10.")

        def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
            self._state.step_count += 1
            digits = "".join(c for c in action.message if c.isdigit())
            guess = int(digits) if digits else -1
            if guess == self.secret:
                return GuessObservation(hint="correct", done=True, reward=1.0)
            return GuessObservation(hint="higher" if guess < self.secret else "lower", reward=-0.1)

        @property
        def state(self) -> State:
            return self._state

    return GuessEnv


def test_openenv_environment_in_process():
    pytest.importorskip("openenv.core.env_server", reason="openenv-core (optional: pip install -e .[openenv])")
    from lit_rlhf.envs.openenv import OpenEnvEnvironment

    env = OpenEnvEnvironment(_guess_env_class()(), observation_field="hint", prompt_column="prompt")
    first = env.reset({"prompt": "Play."}, seed=3)
    assert first == [{"role": "user", "content": "Play.\n\nGuess a number from 1 to 10."}]
    secret = random.Random(3).randint(1, 10)
    low = env.step(Action(str(secret - 1) if secret > 1 else "0"))
    assert (low.observation, low.reward, low.done) == ([{"role": "user", "content": "higher"}], -0.1, False)
    hit = env.step(Action(f"It is {secret}"))
    assert (hit.observation, hit.reward, hit.done) == (None, 1.0, True)
    twin = env.fork()  # an independent instance for a concurrent episode
    twin.reset({"prompt": "Play."}, seed=4)
    assert twin.env is not env.env and env.env.state.step_count == 2
    # without observation_field: every env-specific field as JSON
    raw = OpenEnvEnvironment(_guess_env_class()(), prompt_column=None)
    assert raw.reset({}, seed=0) == [{"role": "user", "content": '{"hint": "Guess a number from 1 to 10."}'}]
    with pytest.raises(ValueError, match="no field 'text'"):
        OpenEnvEnvironment(_guess_env_class()(), action_field="text")
