"""The key-fact gold (`lit_rlhf.judges.keyfact`) as a reward function: the positive control of a
synthetic-gold experiment (Gao et al. 2023, "Scaling Laws for Reward Model Overoptimization"), or
with weight 0 in `reward_weights` the gold logged beside the proxy (`train/rewards/keyfact_recall`).
"""

from __future__ import annotations

from typing import Any

from lit_rlhf.judges.keyfact import keyfact_recall


class KeyFactRecallReward:
    """Reward = key-fact recall of the completion against the row's reference, in [0, 1].

    Args:
        column: the batch column holding each prompt's reference (the key fact).
    """

    __name__ = "keyfact_recall"

    def __init__(self, column: str = "reference") -> None:
        self.column = column

    def __call__(self, prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        references = columns.get(self.column)
        if references is None:
            raise KeyError(f"KeyFactRecallReward needs the batch column {self.column!r} (each prompt's key fact); "
                           f"the batch has {sorted(columns)}")
        return [keyfact_recall(c, r) for c, r in zip(completions, references)]
