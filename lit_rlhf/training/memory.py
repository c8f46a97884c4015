"""`Memory`: the settings every trained module shares that trade compute for memory and never
change a loss, a gradient or a checkpoint, as one `memory:` argument, e.g.
`memory: {gradient_checkpointing: true}`; the module keeps each as an attribute of the same name.
"""

from __future__ import annotations

from typing import Any, Literal

from lit_rlhf.ops import DEFAULT_CHUNK_SIZE

FIELDS = ("gradient_checkpointing", "logprob_chunk_size", "shared_prompt", "frozen_placement",
          "optimizer_in_backward", "release_host_memory")


class Memory:
    """Memory settings of a training module (same values and gradients with any of them).

    Args:
        gradient_checkpointing: recompute activations in the backward pass to save memory (a
            method's other trained networks, PPO's and DRO-V's values, are checkpointed too).
        logprob_chunk_size: the output layer is applied to this many scored tokens at a time
            (recomputed in backward), so the (B, T, V) logits never exist; `null`: the dense
            logits (also, warned, for models with a final logit transform). Policy modules only.
        shared_prompt: rows that share a prompt (a preference pair, a GRPO group, ...) are
            packed into one row `[prompt, completion_1, ..., completion_k]` with a block mask, so
            the prompt is computed once (`lit_rlhf.ops.shared_prompt`); models whose attention
            takes no 4D mask use the padded rows (warned). `false`: always the padded rows.
        frozen_placement: where frozen models (reference policy, reward model) live under a
            sharding strategy (DeepSpeed ZeRO-3): `partitioned` shards them across ranks with
            the trained weights (least memory; every forward all-gathers them), `whole` keeps a
            full copy on every rank (no communication; cf. the N+ paper's Detail 8). Without
            sharding both are the same. Policy modules only.
        optimizer_in_backward: step each parameter with AdamW as soon as its gradient is complete
            in the backward pass and free that gradient (`lit_rlhf.training.in_backward`); same
            weights, state and checkpoints as the usual step. One backward pass per step, one
            process, no clipping, accumulation, DeepSpeed, fp16 or `on_nonfinite: skip`.
        release_host_memory: on CPU, hand freed heap back to the system (glibc's `malloc_trim`,
            `lit_rlhf.host_memory`): `phases` after each optimizer step and before each backward
            pass, `layers` also before each decoder layer run with gradients; `null`: never. A
            lower resident peak at a time cost (docs/guides/memory.md).
    """

    def __init__(
        self,
        gradient_checkpointing: bool = False,
        logprob_chunk_size: int | None = DEFAULT_CHUNK_SIZE,
        shared_prompt: bool = True,
        frozen_placement: Literal["partitioned", "whole"] = "partitioned",
        optimizer_in_backward: bool = False,
        release_host_memory: Literal["phases", "layers"] | None = None,
    ) -> None:
        if logprob_chunk_size is not None and logprob_chunk_size <= 0:
            raise ValueError(f"memory.logprob_chunk_size must be > 0 or null (dense logits), got {logprob_chunk_size}")
        if frozen_placement not in ("partitioned", "whole"):
            raise ValueError(f"memory.frozen_placement must be 'partitioned' or 'whole', got {frozen_placement!r}")
        if release_host_memory not in (None, "phases", "layers"):
            raise ValueError(f"memory.release_host_memory must be null, 'phases' or 'layers', got {release_host_memory!r}")
        self.gradient_checkpointing = bool(gradient_checkpointing)
        self.logprob_chunk_size = logprob_chunk_size
        self.shared_prompt = bool(shared_prompt)
        self.frozen_placement = frozen_placement
        self.optimizer_in_backward = bool(optimizer_in_backward)
        self.release_host_memory = release_host_memory

    def settings(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in FIELDS}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Memory) and self.settings() == other.settings()

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.settings().items() if v != getattr(DEFAULTS, k, v)}
        return f"Memory({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


DEFAULTS = Memory()

# where a module's former memory arguments live now (`lit_rlhf.training.moved`)
MOVED = {name: f"use memory: {{{name}: ...}} (a `lit_rlhf.training.Memory` setting)" for name in FIELDS}
