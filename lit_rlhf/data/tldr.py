"""TL;DR DataModules: SFT, preferences (reward model / DPO) and prompts (PPO / GRPO), on the hub
datasets by default (schemas: `lit_rlhf.data.schema`). Prompts are the D2 query, completions
" " + summary + EOS (D3); SFT and pairs right padded, prompts left padded (D5).
"""

from __future__ import annotations

import logging
from typing import Any

import datasets

from lit_rlhf.data import schema as schemas
from lit_rlhf.data.base import Formatter
from lit_rlhf.data.kinds import PreferenceDataModule, PromptDataModule, _ReferenceTexts, SFTDataModule
from lit_rlhf.data.formatting import (
    BAD_CHOICE, BAD_STRUCTURE, IDENTICAL, MISSING, BadRow, adds_bos, format_tldr_completion, require_finite,
    require_text, truncate_cnndm_query, truncate_tldr_query
)
from lit_rlhf.data.processing import CNNDM, IDS, INT, STR, TRUNCATED
from lit_rlhf.data.sources import parse_split

log = logging.getLogger(__name__)

TLDR_SFT_HUB = "vwxyzjn/summarize_from_feedback_tldr_3_filtered"
TLDR_COMPARISONS_HUB = "openai/summarize_from_feedback"
TLDR_COMPARISONS_CONFIG = "comparisons"
CNNDM_BATCHES = ("batch0_cnndm", "cnndm0", "cnndm2")  # the CNN/DM batches of the comparisons' validation split


def _query(tokenizer, max_prompt_length: int, subreddit, title, post, prefix: str = "",
           bos: bool | None = None) -> tuple[str, list[int]]:
    subreddit = require_text(subreddit, prefix + "subreddit")
    title = require_text(title, prefix + "title")
    post = require_text(post, prefix + "post")
    try:
        query = truncate_tldr_query(tokenizer, subreddit, title, post, max_prompt_length, bos=bos)
    except BadRow as err:
        raise BadRow(err.reason, prefix + err.field, err.detail) from None
    return query.text, query.input_ids


class TLDRPromptFormatter(Formatter):
    """`{subreddit, title, post[, summary], ...}` -> D2 prompt ids; the summary (when the data has
    one) becomes the D3-formatted "reference" text."""

    options = ("max_prompt_length",)

    def __init__(self, dm: Any, **extra: Any):
        super().__init__(dm, **extra)
        self.bos = adds_bos(self.tokenizer)

    def features(self) -> dict[str, Any]:
        return {"prompt": STR, "reference": STR, "_prompt_ids": IDS, "_prompt_len": INT}

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        text, prompt_ids = _query(self.tokenizer, self.max_prompt_length, row.get("subreddit"), row.get("title"),
                                  row.get("post"), bos=self.bos)
        reference = None
        if "summary" in row:
            reference = format_tldr_completion(require_text(row["summary"], "summary"))
        return [{"prompt": text, "reference": reference, "_prompt_ids": prompt_ids, "_prompt_len": len(prompt_ids)}]


class TLDRSFTFormatter(TLDRPromptFormatter):
    """`{subreddit, title, post, summary, ...}` -> D2 prompt ids + D3 completion ids of the summary."""

    consumed = ("post", "summary")
    options = ("max_prompt_length", "max_completion_length", "truncate_completions")

    def features(self) -> dict[str, Any]:
        return {**super().features(), "_completion_ids": IDS, "_completion_len": INT, TRUNCATED: INT}

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        [example] = super().__call__({**row, "summary": row.get("summary")})  # the summary is required here
        ids, cut = self.completion_ids(example["reference"], "summary")
        return [{**example, "_completion_ids": ids, "_completion_len": len(ids), TRUNCATED: cut}]


def is_cnndm(row: dict[str, Any]) -> bool:
    """A CNN/DM news row of the comparisons data: one of its CNN/DM batches, or an `article` and no
    `post` (N+ Detail 6; the reference code tells them apart by batch)."""
    info = row.get("info")
    if row.get("batch") in CNNDM_BATCHES:
        return True
    return isinstance(info, dict) and info.get("post") is None and info.get("article") is not None


class TLDRComparisonFormatter(Formatter):
    """A comparisons row -> prompt ids, chosen (`summaries[choice]`) and rejected completion ids,
    and the grouping columns of the reward model's accuracy table; `eval_split` is `split_name`,
    or `cnndm_split` (when set) for CNN/DM rows, which get the CNN/DM query and lengths."""

    passthrough = ("batch", "worker", "split")
    options = ("max_prompt_length", "max_completion_length", "truncate_completions", "margin_from", "cnndm_split",
               "max_cnndm_prompt_length", "max_cnndm_completion_length")

    def __init__(self, dm: Any, split_name: str = ""):
        super().__init__(dm, split_name=split_name)
        self.bos = adds_bos(self.tokenizer)

    def features(self) -> dict[str, Any]:
        return {"prompt": STR, "chosen": STR, "rejected": STR, "id": STR, "chosen_policy": STR,
                "rejected_policy": STR, "confidence": datasets.Value("int64"), "eval_split": STR,
                "_prompt_ids": IDS, "_chosen_ids": IDS, "_rejected_ids": IDS, "_margin": datasets.Value("float32"),
                "_prompt_len": INT, "_chosen_len": INT, "_rejected_len": INT, TRUNCATED: INT,
                CNNDM: datasets.Value("bool")}

    def _prompt(self, info: dict[str, Any], cnndm: bool) -> tuple[str, list[int]]:
        if not cnndm:
            return _query(self.tokenizer, self.max_prompt_length, info.get("subreddit"), info.get("title"),
                          info.get("post"), prefix="info.", bos=self.bos)
        article = require_text(info.get("article"), "info.article")
        try:
            query = truncate_cnndm_query(self.tokenizer, article, self.max_cnndm_prompt_length, bos=self.bos)
        except BadRow as err:
            raise BadRow(err.reason, "info." + err.field, err.detail) from None
        return query.text, query.input_ids

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        info = row.get("info")
        if not isinstance(info, dict):
            raise BadRow(MISSING if info is None else BAD_STRUCTURE, "info",
                         "expected a dict {id, post, title, subreddit}")
        cnndm = is_cnndm(row)
        text, prompt_ids = self._prompt(info, cnndm)
        summaries = row.get("summaries")
        if not isinstance(summaries, list) or len(summaries) != 2:
            raise BadRow(MISSING if not summaries else BAD_STRUCTURE, "summaries", "expected exactly two summaries")
        for i, s in enumerate(summaries):
            if not isinstance(s, dict):
                raise BadRow(BAD_STRUCTURE, f"summaries[{i}]", "expected a dict {text, policy, note}")
        choice = row.get("choice")
        if choice is None:
            raise BadRow(MISSING, "choice", "missing (None)")
        if isinstance(choice, bool) or choice not in (0, 1):
            raise BadRow(BAD_CHOICE, "choice", f"expected 0 or 1, got {choice!r}")
        texts = [format_tldr_completion(require_text(s.get("text"), f"summaries[{i}].text"))
                 for i, s in enumerate(summaries)]
        chosen, rejected = texts[choice], texts[1 - choice]
        if chosen == rejected:
            raise BadRow(IDENTICAL, "summaries", "the two summaries have the same text")
        extra = row.get("extra")
        confidence = extra.get("confidence") if isinstance(extra, dict) else None
        margin = None
        if self.margin_from == "confidence":
            margin = require_finite(confidence, "extra.confidence")
        limit = self.max_cnndm_completion_length if cnndm else self.max_completion_length
        chosen_ids, cut_c = self.completion_ids(chosen, f"summaries[{choice}].text", limit)
        rejected_ids, cut_r = self.completion_ids(rejected, f"summaries[{1 - choice}].text", limit)
        return [{
            "prompt": text, "chosen": chosen, "rejected": rejected, "id": info.get("id"),
            "chosen_policy": summaries[choice].get("policy"), "rejected_policy": summaries[1 - choice].get("policy"),
            "confidence": confidence,
            "eval_split": self.cnndm_split if cnndm and self.cnndm_split else self.split_name,
            "_prompt_ids": prompt_ids, "_chosen_ids": chosen_ids, "_rejected_ids": rejected_ids, "_margin": margin,
            "_prompt_len": len(prompt_ids), "_chosen_len": len(chosen_ids), "_rejected_len": len(rejected_ids),
            TRUNCATED: cut_c + cut_r, CNNDM: cnndm,
        }]


class TLDRSFTDataModule(_ReferenceTexts, SFTDataModule):
    """TL;DR SFT rows: the D2 query and the D3 reference summary. Metadata: "prompt", "reference"
    and every other source column but `post` (`id`, `subreddit`, `title`)."""

    defaults = {"path": TLDR_SFT_HUB, "test_split": "test", "max_completion_length": 53}
    raw_schema = schemas.TLDR_SFT
    schema_name = "TL;DR SFT"

    def _formatter(self, role: str) -> Formatter:
        return TLDRSFTFormatter(self, passthrough=self.passthrough(role, TLDRSFTFormatter.consumed))


class TLDRPromptDataModule(_ReferenceTexts, PromptDataModule):
    """TL;DR prompts (the D2 query) for PPO and GRPO. Metadata: "prompt", "reference" (" " +
    summary, when there is one) and every other source column but `post`."""

    defaults = {"path": TLDR_SFT_HUB, "test_split": "test"}
    raw_schema = schemas.TLDR_SFT
    schema_name = "TL;DR SFT"

    def _formatter(self, role: str) -> Formatter:
        return TLDRPromptFormatter(self, passthrough=self.passthrough(role, ("post", "summary")))


class TLDRPreferenceDataModule(PreferenceDataModule):
    """TL;DR human comparisons: the chosen summary (`summaries[choice]`) against the other.

    Completions of up to 169 tokens (N+ Detail 4; SFT's stay at 53), longer ones truncated as the
    reference code does. `margin_from="confidence"` gives `batch.margin` `extra.confidence`. CNN/DM
    rows (`is_cnndm`, N+ Detail 6) get the reference code's CNN/DM query; with `cnndm_split` they
    form their own evaluation split, listed after the TL;DR pairs (`eval_split` metadata,
    `eval_split_names(role)`: a reward model logs accuracy per split). Metadata: "batch",
    "confidence", "chosen_policy", "rejected_policy", "worker", "split", "id", "eval_split",
    "prompt", "chosen", "rejected".

    Args:
        cnndm_split: the name of the CNN/DM rows' own evaluation split; null: they count as rows
            of the split they are in.
        max_cnndm_prompt_length: the longest CNN/DM query, in tokens (1919 = 2047 - 128 in the
            reference code).
        max_cnndm_completion_length: the longest CNN/DM completion, in tokens, EOS included.
    """

    defaults = {"path": TLDR_COMPARISONS_HUB, "name": TLDR_COMPARISONS_CONFIG, "max_completion_length": 169,
                "truncate_completions": True}
    margin_sources = ("confidence",)
    raw_schema = schemas.TLDR_COMPARISONS
    schema_name = "TL;DR comparisons"

    def __init__(self, *, cnndm_split: str | None = "validation_cnndm", max_cnndm_prompt_length: int = 1919,
                 max_cnndm_completion_length: int = 155, **kwargs: Any):
        super().__init__(**kwargs)
        self.cnndm_split = cnndm_split
        self.max_cnndm_prompt_length = max_cnndm_prompt_length
        self.max_cnndm_completion_length = max_cnndm_completion_length
        self.cnndm_rows: dict[str, int] = {}

    def _formatter(self, role: str) -> Formatter:
        split_name = parse_split(self.splits[role])[0]
        return TLDRComparisonFormatter(self, split_name)

    def _build(self, role: str, spec: str):
        processed = super()._build(role, spec)
        cnndm = list(processed[CNNDM])
        n = sum(cnndm)
        self.cnndm_rows[role] = n
        if n:
            where = f"their own split {self.cnndm_split!r}" if self.cnndm_split else f"split {spec!r}"
            log.info("%s %s (%s): %d CNN/DM pair(s), formatted with the CNN/DM query and evaluated as %s",
                     type(self).__name__, role, spec, n, where)
            if role != "train" and self.cnndm_split:  # TL;DR pairs first, then CNN/DM: batches rarely mix
                processed = processed.select([i for i, c in enumerate(cnndm) if not c] +
                                             [i for i, c in enumerate(cnndm) if c])
        return processed

    def eval_split_names(self, role: str = "val") -> list[str]:
        """The names of the evaluation splits in the `role` data, in their order (e.g.
        `["validation", "validation_cnndm"]`); each pair's `meta["eval_split"]` is one of them."""
        return list(dict.fromkeys(self.dataset(role)["eval_split"]))
