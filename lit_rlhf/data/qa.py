"""Question/answer prompts for verifiable-reward RL (GRPO on math word problems).

Schemas (`schema`): `gsm8k` (`question`, `answer` ending in `#### <final answer>`: `openai/gsm8k`
config `main`, `bundled:arithmetic`) and `math` (`problem`, `solution` with the final answer in
the last `\\boxed{...}`: MATH, Hendrycks et al. 2021). Each row becomes a left-padded prompt
whose metadata carries `reference` (the final answer alone), `solution` and every other source
column, so `rewards.MathAnswerReward` checks a completion against `reference`; a reference
`math-verify` cannot parse is a bad row. With `chat=True` the prompt is rendered with the chat
template (never truncated: a longer one is a bad row).
"""

from __future__ import annotations

from typing import Any, Literal

from lit_rlhf.data import schema as schemas
from lit_rlhf.data.base import Formatter
from lit_rlhf.data.formatting import (
    BAD_STRUCTURE, PROMPT_TOO_LONG, BadRow, chat_prompt, encode_prompt, require_chat_template, require_text
)
from lit_rlhf.data.kinds import PromptDataModule
from lit_rlhf.data.processing import IDS, INT, STR

QASchema = Literal["gsm8k", "math"]
SCHEMA_FIELDS: dict[str, tuple[str, str]] = {"gsm8k": ("question", "answer"), "math": ("problem", "solution")}
RAW_SCHEMAS: dict[str, tuple[schemas.Schema, str]] = {"gsm8k": (schemas.GSM8K, "GSM8K"), "math": (schemas.MATH, "MATH")}
UNPARSEABLE_ANSWER = "reference answer cannot be parsed"


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, braces matched; None
    when there is none or its braces do not close."""
    starts = [i for marker in ("\\boxed{", "\\fbox{") for i in [text.rfind(marker)] if i >= 0]
    if not starts:
        return None
    start = max(starts)
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def reference_answer(solution: str, schema: QASchema, field: str) -> str:
    """The final answer of a worked solution (`#### x` for gsm8k, the last `\\boxed{x}` for
    math), checked to be parseable by `math-verify`; else `BadRow`."""
    from lit_rlhf.rewards.math_answer import parse_answer

    if schema == "gsm8k":
        if "####" not in solution:
            raise BadRow(BAD_STRUCTURE, field, "no '#### <answer>' line (GSM8K final-answer convention)")
        tail = solution.rsplit("####", 1)[1].strip()
        answer = tail.splitlines()[0].strip() if tail else ""
    else:
        answer = last_boxed(solution) or ""
        if not answer:
            raise BadRow(BAD_STRUCTURE, field, "no \\boxed{...} final answer (MATH convention)")
    if not answer:
        raise BadRow(BAD_STRUCTURE, field, "empty final answer")
    if not parse_answer(answer):
        raise BadRow(UNPARSEABLE_ANSWER, field, f"final answer {answer!r} cannot be parsed by math-verify")
    return answer


class QAPromptFormatter(Formatter):
    """`{question, answer}` or `{problem, solution}` -> prompt ids, `reference`, `solution`."""

    options = ("schema", "max_prompt_length", "prompt_template", "system_prompt", "chat")

    def features(self) -> dict[str, Any]:
        return {"prompt": STR, "reference": STR, "solution": STR, "_prompt_ids": IDS, "_prompt_len": INT}

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        q_field, a_field = SCHEMA_FIELDS[self.schema]
        question = require_text(row.get(q_field), q_field)
        solution = require_text(row.get(a_field), a_field)
        reference = reference_answer(solution, self.schema, a_field)
        text = self.prompt_template.replace("{question}", question.strip())
        if self.chat:
            messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
            text = chat_prompt(self.tokenizer, messages + [{"role": "user", "content": text}])
        ids = encode_prompt(self.tokenizer, text, chat=self.chat)
        if len(ids) > self.max_prompt_length:
            raise BadRow(PROMPT_TOO_LONG, q_field,
                         f"prompt of {len(ids)} tokens > max_prompt_length={self.max_prompt_length} (not truncated)")
        return [{"prompt": text, "reference": reference, "solution": solution, "_prompt_ids": ids,
                 "_prompt_len": len(ids)}]


class QADataModule(PromptDataModule):
    """Question/answer prompts (GSM8K or MATH schema) with their reference answers, left padded.

    The reference answer is in `meta["reference"]`, for verifiable rewards. The default `path`
    is `bundled:arithmetic`; `openai/gsm8k` needs `name: main`, a MATH copy `schema: math`.

    Args:
        schema: `gsm8k` (`question`, `answer` with `#### x`) or `math` (`problem`, `solution`
            with `\\boxed{x}`).
        prompt_template: the user message; `{question}` is replaced by the question.
        system_prompt: an optional system message (chat only).
        chat: render the prompt with the tokenizer's chat template (True) or as plain text.
    """

    defaults = {"path": "bundled:arithmetic", "test_split": "test"}

    def __init__(self, *, schema: QASchema = "gsm8k", prompt_template: str = "{question}",
                 system_prompt: str | None = None, chat: bool = True, **kwargs: Any):
        if schema not in SCHEMA_FIELDS:
            raise ValueError(f"schema must be one of {sorted(SCHEMA_FIELDS)}, got {schema!r}")
        if "{question}" not in prompt_template:
            raise ValueError(f"prompt_template must contain '{{question}}', got {prompt_template!r}")
        self.raw_schema, self.schema_name = RAW_SCHEMAS[schema]  # read by the base class's source loader
        super().__init__(**kwargs)
        self.schema = schema
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.chat = chat

    def _formatter(self, role: str) -> Formatter:
        if self.chat:
            require_chat_template(self.tokenizer, f"{type(self).__name__} with chat=True")
        passthrough = self.passthrough(role, (*SCHEMA_FIELDS[self.schema], "prompt", "reference", "solution"))
        return QAPromptFormatter(self, passthrough=passthrough)

    def references(self, role: str = "test") -> tuple[list[str], list[str]]:
        """(prompt texts, reference answers) of a split, in order (for accuracy evaluation)."""
        ds = self.dataset(role)
        return list(ds["prompt"]), list(ds["reference"])
