"""A method written as a researcher writes one: a GRPO subclass that pins a setting of its base
in its `super().__init__` call (imported by the CLI from `tests.modules.pinned.PinnedGRPO`)."""

from __future__ import annotations

from typing import Any

from lit_rlhf.modules import GRPOModule


class PinnedGRPO(GRPOModule):
    """GRPO on pairs: always two completions per prompt."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(num_generations=2, **kwargs)
