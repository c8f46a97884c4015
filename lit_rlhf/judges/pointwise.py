"""Pointwise scorers for `RubricJudge` on the pairwise judges' backends.

- `LocalLMScorer` (`LocalLMJudge`'s loading and batching): P(Yes) / (P(Yes) + P(No)) of the next
  token after "Answer:", each summed over the word's first-token spellings. Nothing is sampled.
- `ChatAPIScorer` (`ChatAPIJudge`'s retries and key redaction): the reply's last `Verdict: YES` /
  `Verdict: NO` reads 1 / 0.

The prompt is `template` with {prompt}, {completion} and {criterion}
(`lit_rlhf.judges.rubric.POINTWISE_TEMPLATE` by default); an unreadable item is invalid, never an
exception.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from lit_rlhf.judges.chat_api import ChatAPIJudge
from lit_rlhf.judges.local_lm import LocalLMJudge, verdict_token_ids
from lit_rlhf.judges.rubric import POINTWISE_TEMPLATE, Criterion, PointScore, PointwiseScorer, check_pairs

_VERDICT = re.compile(r"verdict\s*:\s*\**\s*(yes|no)\b", re.IGNORECASE)
CHAT_SUFFIX = "\n\nExplain briefly, then end with one line: `Verdict: YES` or `Verdict: NO`."


def _check(template: str) -> str:
    missing = [f for f in ("{prompt}", "{completion}", "{criterion}") if f not in template]
    if missing:
        raise ValueError(f"a pointwise template needs the fields {missing}, got {template!r}")
    return template


class LocalLMScorer(LocalLMJudge, PointwiseScorer):
    """A local causal LM as a pointwise scorer: P(Yes) / (P(Yes) + P(No)) after the prompt.

    Args:
        template: the user message ({prompt}, {completion}, {criterion}).
        answer_prefix: what the judge has "already written" before its Yes / No.

    `model_name`, `batch_size`, `max_length`, `dtype`, `device`, `model` and `tokenizer` are as
    in `LocalLMJudge`.

    `raw` is "P(Yes)=<p> P(No)=<p>"; both 0 or non-finite make the item invalid.
    """

    def __init__(self, model_name: str, template: str = POINTWISE_TEMPLATE, answer_prefix: str = "Answer:",
                 batch_size: int = 8, max_length: int | None = None, dtype: str | torch.dtype | None = None,
                 device: str | torch.device = "cpu", model: Any = None, tokenizer: Any = None) -> None:
        super().__init__(model_name, batch_size=batch_size, max_length=max_length, answer_prefix=answer_prefix,
                         dtype=dtype, device=device, model=model, tokenizer=tokenizer)
        self.pointwise_template = _check(template)

    def _load(self) -> None:
        super()._load()
        self._verdict_ids = verdict_token_ids(self.tokenizer(), ("Yes", "No"))

    def judge(self, prompts: list[str], completions_a: list[str], completions_b: list[str]):
        raise TypeError("LocalLMScorer scores one answer against a criterion (score), it does not compare two")

    def scoring_prompt(self, prompt: str, completion: str, criterion: Criterion) -> str:
        """The full text the judge reads, ending where its Yes / No goes."""
        user = self.pointwise_template.format(prompt=prompt, completion=completion, criterion=criterion.description)
        return self.render([{"role": "user", "content": user}])

    def score(self, prompts: list[str], completions: list[str], criterion: Criterion) -> list[PointScore]:
        check_pairs(prompts, completions)
        texts = [self.scoring_prompt(p, c, criterion) for p, c in zip(prompts, completions)]
        return self.read_verdicts(texts, _yes_share, lambda why: PointScore(None, "", why))


def _yes_share(p_yes: float, p_no: float) -> PointScore:
    raw = f"P(Yes)={p_yes:.6g} P(No)={p_no:.6g}"
    total = p_yes + p_no
    ok = math.isfinite(total) and total > 0
    return PointScore(p_yes / total if ok else None, raw, None if ok else "no Yes/No probability")


class ChatAPIScorer(ChatAPIJudge, PointwiseScorer):
    """A chat model behind an OpenAI-compatible endpoint as a pointwise scorer: the reply's last
    `Verdict: YES` scores 1, `Verdict: NO` 0, anything else is invalid (the reply kept in `raw`).

    Args:
        template: the user message ({prompt}, {completion}, {criterion}); the verdict format
            (`CHAT_SUFFIX`) is appended.

    `base_url`, `model`, `api_key_env`, `max_concurrency`, `timeout_s`, `max_retries`,
    `backoff_base_s`, `backoff_max_s`, `temperature` and `max_tokens` are as in `ChatAPIJudge`.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str | None = "OPENAI_API_KEY",
                 template: str = POINTWISE_TEMPLATE, max_concurrency: int = 8, timeout_s: float = 60.0,
                 max_retries: int = 3, backoff_base_s: float = 1.0, backoff_max_s: float = 30.0,
                 temperature: float = 0.0, max_tokens: int = 256) -> None:
        super().__init__(base_url, model, api_key_env, max_concurrency=max_concurrency, timeout_s=timeout_s,
                         max_retries=max_retries, backoff_base_s=backoff_base_s, backoff_max_s=backoff_max_s,
                         temperature=temperature, max_tokens=max_tokens)
        self.pointwise_template = _check(template)

    def judge(self, prompts: list[str], completions_a: list[str], completions_b: list[str]):
        raise TypeError("ChatAPIScorer scores one answer against a criterion (score), it does not compare two")

    def score(self, prompts: list[str], completions: list[str], criterion: Criterion) -> list[PointScore]:
        check_pairs(prompts, completions)
        return self._each(lambda i, p, c: self._score_one(i, p, c, criterion), prompts, completions)

    def _score_one(self, index: int, prompt: str, completion: str, criterion: Criterion) -> PointScore:
        user = self.pointwise_template.format(prompt=prompt, completion=completion, criterion=criterion.description)
        text, error = self._reply(index, [{"role": "user", "content": user + CHAT_SUFFIX}])
        if error is not None:
            return PointScore(None, "", error)
        found = _VERDICT.findall(text)
        if not found:
            return PointScore(None, text, "unparseable reply (no 'Verdict: YES|NO')")
        return PointScore(1.0 if found[-1].lower() == "yes" else 0.0, text, None)
