"""Evaluation prompts: a fixed set of prompts (texts, token ids, references) a policy is judged on."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class EvalPrompts:
    """A fixed set of evaluation prompts.

    prompts: the prompt texts as the policy reads them (the D2 query, a chat-templated prompt).
    judge_prompts: what the judge is shown as the prompt (the raw instruction when the data has
        one, e.g. UltraFeedback's `raw_prompt`, else `prompts`).
    prompt_ids: token ids of each prompt (no padding), as the DataModule encoded them.
    references: the reference completion of each prompt (None where the data has none).
    """

    prompts: list[str]
    judge_prompts: list[str]
    prompt_ids: list[list[int]]
    references: list[str | None]

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def key(self) -> str:
        """A hash of the prompt ids: equal keys mean the same evaluation set."""
        return hashlib.sha256(json.dumps(self.prompt_ids).encode()).hexdigest()[:16]

    def require_references(self) -> list[str]:
        missing = [i for i, r in enumerate(self.references) if r is None]
        if missing:
            raise ValueError(
                f"baseline 'reference' needs a reference completion for every evaluation prompt; "
                f"{len(missing)} of {len(self)} have none (first: prompt {missing[0]}). Use a split with "
                "references (TL;DR SFT/prompt data), set reference_column, or use baseline 'initial'"
            )
        return list(self.references)  # type: ignore[arg-type]


def prompts_from_dataset(ds: Any, num_prompts: int | None, reference_column: str = "reference",
                         tokenizer: Any = None, chat: bool = False) -> EvalPrompts:
    """The first `num_prompts` distinct prompts (by text) of a processed `lit_rlhf.data` dataset.

    Uses the dataset's "prompt" column, its "_prompt_ids" (or encodes the prompt with `tokenizer`
    when the column is missing), "raw_prompt" for the judge when present, and `reference_column`.
    """
    columns = set(ds.column_names)
    if "prompt" not in columns:
        raise ValueError(f"the evaluation dataset has no 'prompt' column (columns: {sorted(columns)})")
    if "_prompt_ids" not in columns and tokenizer is None:
        raise ValueError("the evaluation dataset has no '_prompt_ids' column: pass the tokenizer to encode prompts")
    first: dict[str, int] = {}  # each distinct prompt's first row
    for i, text in enumerate(ds["prompt"]):
        if num_prompts is not None and len(first) >= num_prompts:
            break
        if text is not None:
            first.setdefault(text, i)
    rows = list(first.values())
    if not rows:
        raise ValueError("the evaluation dataset has no prompts")
    sub = ds.select(rows)
    prompts = list(sub["prompt"])
    if "_prompt_ids" in columns:
        prompt_ids = [list(map(int, ids)) for ids in sub["_prompt_ids"]]
    else:
        prompt_ids = [encode_prompt_text(tokenizer, p, chat) for p in prompts]
    judge_prompts = list(sub["raw_prompt"]) if "raw_prompt" in columns else prompts
    references = list(sub[reference_column]) if reference_column in columns else [None] * len(rows)
    return EvalPrompts(prompts, [j if j is not None else p for j, p in zip(judge_prompts, prompts)], prompt_ids,
                       references)


def prompts_from_texts(tokenizer: Any, prompts: Sequence[str], references: Sequence[str] | None = None,
                       chat: bool = False) -> EvalPrompts:
    """Evaluation prompts given as texts (encoded like the DataModules do; `chat`: the texts are
    already chat-templated, so no BOS is added)."""
    if not prompts:
        raise ValueError("prompts is empty")
    if references is not None and len(references) != len(prompts):
        raise ValueError(f"got {len(references)} references for {len(prompts)} prompts")
    ids = [encode_prompt_text(tokenizer, p, chat) for p in prompts]
    refs = list(references) if references is not None else [None] * len(prompts)
    return EvalPrompts(list(prompts), list(prompts), ids, refs)


def encode_prompt_text(tokenizer: Any, text: str, chat: bool = False) -> list[int]:
    from lit_rlhf.data.formatting import encode_prompt

    return encode_prompt(tokenizer, text, chat=chat)
