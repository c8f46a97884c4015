"""Demonstrated episodes as SFT data: an environment's multi-turn format taught before RL.

A small instruct model may never produce an environment's action format (SmolLM2-135M-Instruct
opens no `<tool_call>` in 16 greedy episodes of the calculator recipe), leaving an outcome reward
nothing to reinforce. A demonstration (`demonstration`: row -> the policy's turns as text) is
played through the environment itself (`play_demonstration`), so an SFT example is laid out token
for token as `lit_rlhf.envs.rollout` lays out a sampled episode: the first observation
(`ChatFormat.prompt_ids`), each turn encoded with EOS, and after each turn that does not end the
episode the observation the environment really computed (`ChatFormat.observation_ids`). The loss
is on the policy's turns only (`SFTBatch.loss_mask`). A demonstration that does not end its
episode, or passes `max_completion_length`, is a bad row (`on_bad_rows`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from lit_rlhf.data.collate import collect_meta, pad_right
from lit_rlhf.data.formatting import BadRow
from lit_rlhf.data.processing import IDS, INT, Formatter
from lit_rlhf.data.qa import QADataModule
from lit_rlhf.envs.base import Action, Environment, check_observation
from lit_rlhf.envs.chat import ChatFormat
from lit_rlhf.types import SFTBatch

UNFINISHED = "demonstration does not end its episode"
TOO_LONG = "demonstrated episode too long"


def play_demonstration(env: Environment, chat: ChatFormat, row: dict[str, Any], turns: Sequence[str],
                       seed: int = 0) -> tuple[list[int], list[int], list[bool]]:
    """Play the policy turns `turns` through `env` from `row` -> (prompt ids, the episode's ids
    after the prompt, True on the policy's tokens). Raises `BadRow` when the episode is not done
    after the last turn or is done before it."""
    eos = chat.tokenizer.eos_token_id
    observation = check_observation(env.reset(row, seed), f"{type(env).__name__}.reset")
    if observation is None:
        raise ValueError(f"{type(env).__name__}.reset gives no first observation; a demonstration needs the "
                         "environment's own prompt")
    prompt = chat.prompt_ids(observation)
    ids: list[int] = []
    policy: list[bool] = []
    for k, text in enumerate(turns):
        turn = chat.encode(text) + [eos]
        ids += turn
        policy += [True] * len(turn)
        result = env.step(Action(text, tuple(turn)))
        if result.done:
            if k != len(turns) - 1:
                raise BadRow(UNFINISHED, "demonstration", f"the episode ended after turn {k + 1} of {len(turns)}")
            return prompt, ids, policy
        observation_ids = chat.observation_ids(result.observation)
        ids += observation_ids
        policy += [False] * len(observation_ids)
    raise BadRow(UNFINISHED, "demonstration", f"the environment is not done after the last of {len(turns)} turn(s)")


class DemonstrationFormatter(Formatter):
    """A QA row -> its demonstrated episode (see the module docstring)."""

    def __init__(self, prompts: Formatter, environment: Environment, demonstration: Callable, tokenizer,
                 max_completion_length: int):
        self.prompts = prompts  # the QA formatter: prompt text, reference, solution
        self.environment = environment
        self.demonstration = demonstration
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer)
        self.max_completion_length = max_completion_length
        self.passthrough = prompts.passthrough

    def features(self) -> dict[str, Any]:
        base = {k: v for k, v in self.prompts.features().items() if not k.startswith("_")}
        return {**base, "_prompt_ids": IDS, "_completion_ids": IDS, "_policy_mask": IDS,
                "_prompt_len": INT, "_completion_len": INT}

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        examples = []
        for example in self.prompts(row):
            fields = {k: v for k, v in example.items() if not k.startswith("_")}
            turns = list(self.demonstration({**row, **fields}))
            prompt, ids, policy = play_demonstration(self.environment, self.chat, {**row, **fields}, turns)
            if len(ids) > self.max_completion_length:
                raise BadRow(TOO_LONG, "demonstration", f"{len(ids)} tokens after the prompt > max_completion_length="
                                                        f"{self.max_completion_length} (not truncated)")
            examples.append({**fields, "_prompt_ids": prompt, "_completion_ids": ids,
                             "_policy_mask": [int(p) for p in policy], "_prompt_len": len(prompt),
                             "_completion_len": len(ids)})
        return examples

    def config(self) -> dict[str, Any]:
        env = self.environment
        describe = getattr(env, "system_message", None)
        return {"prompts": self.prompts.config(), "environment": type(env).__qualname__,
                "system_message": describe() if callable(describe) else None,
                "demonstration": getattr(self.demonstration, "__qualname__", repr(self.demonstration)),
                "max_completion_length": self.max_completion_length}


class DemonstrationCollator:
    """Examples with `_prompt_ids`, `_completion_ids`, `_policy_mask` -> `SFTBatch` (right
    padded), `loss_mask` on the policy's tokens only."""

    batch_type = SFTBatch

    def __init__(self, pad_token_id: int):
        self.pad_token_id = int(pad_token_id)

    def __call__(self, examples: Sequence[dict[str, Any]]) -> SFTBatch:
        seqs = [list(ex["_prompt_ids"]) + list(ex["_completion_ids"]) for ex in examples]
        ids, attention_mask = pad_right(seqs, self.pad_token_id)
        loss_mask = attention_mask.clone().zero_()
        for i, ex in enumerate(examples):
            start = len(ex["_prompt_ids"])
            for j, is_policy in enumerate(ex["_policy_mask"]):
                loss_mask[i, start + j] = bool(is_policy)
        return SFTBatch(ids, attention_mask, loss_mask, collect_meta(examples))


class DemonstrationDataModule(QADataModule):
    """Question/answer rows played as demonstrated episodes of an environment, for SFT.

    An SFT stage that teaches an environment's format before RL (see the module docstring); the
    QA prompt is the user's message (`prompt_template` shapes it, `chat` defaults to False: the
    environment renders the conversation).

    Args:
        environment: the environment the RL stage runs (the same settings, so the demonstrations
            see the same system message and tool outputs).
        demonstration: `row -> list of the policy's turns (text)`; the row holds the QA
            DataModule's `prompt`, `reference` and `solution` and the source columns
            (`lit_rlhf.envs.demonstrations.calculator_demonstration` for the bundled arithmetic).
        max_completion_length: the longest episode after the prompt, in tokens (longer: a bad row).
    """

    defaults = {"chat": False}
    def __init__(self, *, environment: Environment, demonstration: Callable, max_completion_length: int = 256,
                 **kwargs: Any):
        super().__init__(**kwargs)
        if not isinstance(environment, Environment):
            raise TypeError(f"environment must be a lit_rlhf.envs.Environment, got {type(environment).__name__}")
        self.environment = environment
        self.demonstration = demonstration
        self.max_completion_length = int(max_completion_length)

    def _formatter(self, role: str) -> Formatter:
        return DemonstrationFormatter(super()._formatter(role), self.environment, self.demonstration, self.tokenizer,
                                      self.max_completion_length)

    def _collator(self, role: str) -> DemonstrationCollator:
        return DemonstrationCollator(self.tokenizer.pad_token_id)


def calculator_demonstration(row: dict[str, Any]) -> list[str]:
    """The bundled arithmetic's worked solution (`a op b = c`) as two turns: the calculator call
    with `a op b` (`lit_rlhf.envs.ToolEnvironment`'s format), then the reference answer alone."""
    solution = str(row.get("solution") or "")
    first = solution.strip().splitlines()[0] if solution.strip() else ""
    expression = first.split("=")[0].strip()
    if not expression or "=" not in first:
        raise BadRow("no worked expression", "answer", f"expected 'a op b = c' on the first line, got {first!r}")
    call = '{"name": "calculator", "arguments": {"expression": "%s"}}' % expression
    return [f"<tool_call>{call}</tool_call>", str(row["reference"])]
