"""UltraFeedback as ranked lists: one `openbmb/UltraFeedback` row is one list of K completions
(`ListBatch`), for listwise DPO and a reward model trained on rankings
(`lit_rlhf.losses.plackett_luce_loss`), formatted as `UltraFeedbackSingleDataModule`'s."""

from __future__ import annotations

from typing import Any

import datasets

from lit_rlhf.data import schema as schemas
from lit_rlhf.data.base import Formatter
from lit_rlhf.data.collate import ListCollator
from lit_rlhf.data.kinds import CompletionDataModule
from lit_rlhf.data.formatting import BAD_STRUCTURE, MISSING, BadRow, chat_prompt, require_text
from lit_rlhf.data.processing import IDS, INT, STR, TRUNCATED
from lit_rlhf.data.ultrafeedback import COMPLETION_OPTIONS, ULTRAFEEDBACK_HUB, _ChatFormatter

NO_RANKING = "no ranking (all scores equal)"


class UltraFeedbackListFormatter(_ChatFormatter):
    """An openbmb row -> one list: prompt ids, K completion ids and their K scores, in the row's order."""

    passthrough = ("source",)
    options = (*COMPLETION_OPTIONS, "list_size", "score_field")

    def features(self) -> dict[str, Any]:
        return {"prompt": STR, "raw_prompt": STR, "responses": datasets.Sequence(STR),
                "models": datasets.Sequence(STR), "_prompt_ids": IDS, "_completion_ids": datasets.Sequence(IDS),
                "_scores": datasets.Sequence(datasets.Value("float64")), "_prompt_len": INT, "_completion_len": INT,
                TRUNCATED: INT}

    def __call__(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        instruction = require_text(row.get("instruction"), "instruction")
        completions = row.get("completions")
        if not isinstance(completions, list) or len(completions) != self.list_size:
            n = len(completions) if isinstance(completions, list) else type(completions).__name__
            raise BadRow(MISSING if not completions else BAD_STRUCTURE, "completions",
                         f"expected a list of list_size={self.list_size} completions, got {n}")
        prompt = chat_prompt(self.tokenizer, [{"role": "user", "content": instruction}])
        prompt_ids = self.prompt_ids(prompt, "instruction")
        texts, _, scores, ids, cuts = zip(*(self.answer(instruction, c, f"completions[{i}]", self.score_field)
                                            for i, c in enumerate(completions)))
        if len(set(scores)) == 1:
            raise BadRow(NO_RANKING, f"completions[*].{self.score_field}",
                         f"all {len(scores)} completions score {scores[0]}: nothing to rank")
        return [{"prompt": prompt, "raw_prompt": instruction, "responses": list(texts),
                 "models": [c.get("model") or "" for c in completions], "_prompt_ids": prompt_ids,
                 "_completion_ids": list(ids), "_scores": list(scores), "_prompt_len": len(prompt_ids),
                 "_completion_len": max(map(len, ids)), TRUNCATED: sum(cuts)}]


class UltraFeedbackListDataModule(CompletionDataModule):
    """openbmb/UltraFeedback rows as ranked lists of `list_size` completions -> `ListBatch`.

    One row is one list: `batch_size` counts lists, the train order shuffles whole lists, and rows
    that share an instruction stay separate lists. A list ranks by descending `score_field`, ties
    in the row's order (`lit_rlhf.losses.rank_by_scores`). Bad rows, besides the usual ones: a row
    without exactly `list_size` completions, or whose scores are all equal (`no ranking`).
    Metadata per list: "prompt", "raw_prompt", "responses" (the K texts), "models", "source".

    Args:
        list_size: K, the completions of every list (a row with another number is a bad row; >= 2).
        score_field: the completion field that ranks a list (highest first).
    """

    defaults = {"path": ULTRAFEEDBACK_HUB, "val_split": None}
    raw_schema = schemas.ULTRAFEEDBACK
    schema_name = "openbmb/UltraFeedback"

    def __init__(self, *, list_size: int = 4, score_field: str = "overall_score", **kwargs: Any):
        if list_size < 2:
            raise ValueError(f"list_size must be >= 2 (a ranking needs two completions), got {list_size}")
        super().__init__(**kwargs)
        self.list_size, self.score_field = list_size, score_field

    def _formatter(self, role: str) -> Formatter:
        return UltraFeedbackListFormatter(self)

    def _collator(self, role: str) -> ListCollator:
        return ListCollator(self.tokenizer.pad_token_id)
