"""A local Hugging Face causal LM as a pairwise judge, read from next-token probabilities.

No sampling: the judge prompt (in the tokenizer's chat template when it has one, the assistant
turn opened) is followed by `answer_prefix` ("Preferred:" for TL;DR, "[[" for MT-Bench), and the
verdict is whichever verdict letter gets the higher next-token probability: P(A) sums the first
tokens of "A" and " A" (less any token both verdicts share, such as a bare space), P(B) likewise.
Batched with left padding and `position_ids_from_mask` (D5).
"""

from __future__ import annotations

import inspect
import logging
import math
from typing import Any, Callable

import torch

from lit_rlhf.judges.base import RandomOrderJudge, ShownVerdict
from lit_rlhf.judges.templates import JudgeTemplate, get_template
from lit_rlhf.ops import position_ids_from_mask

log = logging.getLogger(__name__)


def verdict_token_ids(tokenizer, verdicts: tuple[str, str] = ("A", "B")) -> tuple[list[int], list[int]]:
    """First-token ids of each verdict's spellings (bare and space-prefixed), minus shared ids."""
    spellings = [{ids[0] for ids in (tokenizer.encode(t, add_special_tokens=False) for t in (v, " " + v)) if ids}
                 for v in verdicts]
    shared = spellings[0] & spellings[1]
    first, second = (sorted(s - shared) for s in spellings)
    if not first or not second:
        raise ValueError(f"the tokenizer cannot tell the verdicts {verdicts} apart by their first token")
    return first, second


class LocalLMJudge(RandomOrderJudge):
    """Pairwise judge on a local causal LM (any name `lit_rlhf.models.load_causal_lm` accepts).

    Args:
        model_name: e.g. "smollm2-135m-instruct", a local directory, a .gguf file.
        template: "tldr", "mt_bench", a custom string with {prompt}/{a}/{b}, or a JudgeTemplate.
        seed: seeds the per-item A/B presentation order (as in every LM judge).
        randomise_order: False shows every pair as (a, b).
        batch_size: rows per forward pass.
        max_length: a judge prompt longer than this many tokens makes its item invalid (nothing is
            truncated: cutting a judge prompt silently changes what is judged). None = no limit.
        answer_prefix: what the judge has "already written" before the verdict letter; None = the
            template's own.
        dtype: the dtype the model runs in.
        device: where the model runs.
        model: an already loaded model to use instead of loading `model_name` (e.g. to share
            weights).
        tokenizer: its tokenizer, given with `model`; it must have a PAD token.

    `raw` is "P(A)=<p> P(B)=<p>": the next-token probabilities of the verdicts as shown (A = the
    completion shown first). Equal probabilities are a tie; non-finite ones make the item invalid.
    The model is loaded on the first call of `judge`, so constructing the judge is cheap.
    """

    def __init__(self, model_name: str, template: str | dict | JudgeTemplate = "tldr", seed: int = 0,
                 randomise_order: bool = True, batch_size: int = 8, max_length: int | None = None,
                 answer_prefix: str | None = None, dtype: str | torch.dtype | None = None,
                 device: str | torch.device = "cpu", model: Any = None, tokenizer: Any = None) -> None:
        super().__init__(seed=seed, randomise_order=randomise_order)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model_name = model_name
        self.template = get_template(template)
        self.batch_size = int(batch_size)
        self.max_length = max_length
        self.answer_prefix = self.template.answer_prefix if answer_prefix is None else answer_prefix
        self.dtype = dtype
        self.device = torch.device(device)
        self._model = model
        self._tokenizer = tokenizer
        self._verdict_ids: tuple[list[int], list[int]] | None = None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(model_name={self.model_name!r}, template={self.template.name!r}, "
                f"seed={self.seed}, randomise_order={self.randomise_order}, batch_size={self.batch_size})")

    def _load(self) -> None:
        from lit_rlhf.models import load_causal_lm

        tokenizer = self.tokenizer()
        if self._model is None:
            self._model = load_causal_lm(self.model_name, tokenizer, dtype=self.dtype)
        self._model.to(self.device).eval()
        self._verdict_ids = verdict_token_ids(tokenizer)

    def tokenizer(self) -> Any:
        """The judge's tokenizer (loaded on first use: the prompt is formatted with its chat template)."""
        if self._tokenizer is None:
            from lit_rlhf.models import load_tokenizer

            self._tokenizer = load_tokenizer(self.model_name)
        return self._tokenizer

    def judge_prompt(self, prompt: str, first: str, second: str) -> str:
        """The full text the judge model reads, ending where the verdict letter goes."""
        return self.render(self.template.messages(prompt, first, second))

    def render(self, messages: list[dict[str, str]]) -> str:
        """`messages` in the tokenizer's chat template (or plain, without one), then `answer_prefix`."""
        tok = self.tokenizer()
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = "\n\n".join(m["content"] for m in messages) + "\n\n"
        return text + self.answer_prefix

    def _judge_shown(self, prompts: list[str], firsts: list[str], seconds: list[str]):
        texts = [self.judge_prompt(p, f, s) for p, f, s in zip(prompts, firsts, seconds)]
        return self.read_verdicts(texts, _verdict_from_probs, lambda why: (None, "", why))

    @torch.no_grad()
    def read_verdicts(self, texts: list[str], verdict: Callable[[float, float], Any],
                      too_long: Callable[[str], Any]) -> list[Any]:
        """`verdict(p_first, p_second)` of the next-token probabilities after each text, in batches
        of `batch_size`, or `too_long(message)` for a text of more than `max_length` tokens."""
        if not texts:
            return []
        if self._model is None or self._verdict_ids is None:
            self._load()
        tok = self._tokenizer
        # texts from a chat template carry their own special tokens; a plain prompt gets the usual ones
        add_special = not getattr(tok, "chat_template", None)
        encoded = [tok.encode(text, add_special_tokens=add_special) for text in texts]
        results: list[Any] = [None] * len(encoded)
        runnable = []
        for i, ids in enumerate(encoded):
            if self.max_length is not None and len(ids) > self.max_length:
                results[i] = too_long(f"judge prompt has {len(ids)} tokens > max_length={self.max_length}")
            else:
                runnable.append(i)
        for start in range(0, len(runnable), self.batch_size):
            rows = runnable[start : start + self.batch_size]
            for i, (p_a, p_b) in zip(rows, self._verdict_probs([encoded[k] for k in rows]).tolist()):  # (b, 2)
                results[i] = verdict(p_a, p_b)
        return results

    def _verdict_probs(self, rows: list[list[int]]) -> torch.Tensor:
        """(b, 2) next-token probabilities of the first and second verdict after each row."""
        pad = self._tokenizer.pad_token_id
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)  # (b, T) left padded
        attention_mask = torch.zeros((len(rows), width), dtype=torch.bool)  # (b, T)
        for k, r in enumerate(rows):
            input_ids[k, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            attention_mask[k, width - len(r) :] = True
        kwargs = {}
        if "logits_to_keep" in inspect.signature(self._model.forward).parameters:
            kwargs["logits_to_keep"] = 1  # only the last position's logits: (b, 1, V)
        out = self._model(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device),
                          position_ids=position_ids_from_mask(attention_mask).to(self.device), **kwargs)
        probs = torch.softmax(out.logits[:, -1, :].float(), dim=-1)  # (b, V)
        ids_a, ids_b = self._verdict_ids
        return torch.stack([probs[:, ids_a].sum(-1), probs[:, ids_b].sum(-1)], dim=-1).cpu()


def _verdict_from_probs(p_a: float, p_b: float) -> tuple[ShownVerdict | None, str, str | None]:
    raw = f"P(A)={p_a:.6g} P(B)={p_b:.6g}"
    if not (math.isfinite(p_a) and math.isfinite(p_b)):
        return None, raw, "non-finite verdict probabilities"
    return ("first" if p_a > p_b else "second" if p_b > p_a else "tie"), raw, None
