"""DAPO's dynamic sampling (Yu et al. 2025, Sec. 3.2 and Eq. 11): `DAPOModule.collect_rollout`
(`lit_rlhf.modules.dapo`) and the pure rollout surgery it uses here (`take_rows`, `cat_rollouts`).

A group whose G rewards are all equal (all right or all wrong, for a 0/1 reward) has zero
advantage and no gradient; it only dilutes the batch. Dynamic sampling drops such groups and
samples more prompts until the batch holds B informative groups:

1. the step's B prompts are sampled, scored and shaped as usual (`OnlineModule.collect_rollout`: the
   method's extras and the rollout hooks included);
2. the informative groups are kept (`losses.dapo.informative_groups`);
3. while fewer than B are kept and fewer than `max_sampling_rounds` rounds were run, B more
   prompts are drawn from the *refill stream* and step 2 repeats;
4. the first B informative groups make the batch. When the rounds run out first, the batch is
   topped up with dropped (zero-advantage) groups so it keeps its B*G rows, and the shortfall
   is logged (`dynamic_sampling/filled_groups`); with no informative group at all the
   advantages are all 0 and the step changes nothing but the KL term.

The refill stream is the train dataset read in a permutation drawn from `seed` and the refill
counter (`torch.Generator().manual_seed(seed + 7919 * k)` for the k-th refill, rank r taking
rows [r*B, (r+1)*B) of it); it never touches the global random state and its counter is saved in
checkpoints, so a resumed run draws the same prompts. All ranks run the same number of rounds
(the "need more" decision is reduced over ranks), so sharded generation stays in step.

Every generated response counts as an episode; `dynamic_sampling/rollouts_per_step` is the
number of responses generated per response trained on (1 without dynamic sampling).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from lit_rlhf.types import Rollout


def take_rows(rollout: Rollout, rows: Tensor) -> Rollout:
    """The rollout restricted to `rows` (`Rollout.rows`: tensor fields, extras and `meta` lists)."""
    return rollout.rows(rows)


def cat_rollouts(parts: list[Rollout], pad_token_id: int = 0) -> Rollout:
    """Rollouts concatenated by rows (extras too); prompts are left padded to the longest (D5)."""
    if len(parts) == 1:
        return parts[0]
    width = max(p.prompt_ids.shape[1] for p in parts)
    out: dict[str, Any] = {}
    for name in Rollout._fields:
        values = [getattr(p, name) for p in parts]
        if name == "meta":
            out[name] = {k: [x for p in parts for x in p.meta[k]] for k in parts[0].meta}
        elif name == "extras":
            if any(p.extras.keys() != parts[0].extras.keys() for p in parts):
                raise ValueError("cannot concatenate rollouts with different extras")
            out[name] = {k: torch.cat([p.extras[k] for p in parts]) for k in parts[0].extras}
        elif values[0] is None:
            if any(v is not None for v in values):
                raise ValueError(f"cannot concatenate rollouts where only some have {name!r}")
            out[name] = None
        elif name in ("prompt_ids", "prompt_mask"):
            fill = 0 if name == "prompt_mask" else pad_token_id
            out[name] = torch.cat([F.pad(v.long(), (width - v.shape[1], 0), value=fill) for v in values])
        else:
            out[name] = torch.cat(values)
    out["prompt_mask"] = out["prompt_mask"].bool()
    return Rollout(**out)


def group_rows(groups: Tensor, group_size: int) -> Tensor:
    """Row indices of the given group indices (each group's G rows contiguous)."""
    return (groups.unsqueeze(1) * group_size + torch.arange(group_size, device=groups.device)).flatten()
