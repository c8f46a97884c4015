"""How a module trades compute for memory: settings that never change what is computed.

`Memory` groups the knobs every trained module shares that lower peak memory (or move where it
is spent) at a cost in time, and never change a loss, a gradient or a checkpoint: a run with
any of them resumes a run without. A module takes one `memory:` argument instead of six, so
its constructor carries the method's settings:

    memory: {gradient_checkpointing: true, release_host_memory: phases}

(`--model.init_args.memory.gradient_checkpointing true` on the command line). The module keeps
each value as the attribute of the same name (`lit_rlhf.training.settings`).
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
        logprob_chunk_size: log-probs are computed from the last hidden states, the output
            layer applied to this many scored tokens at a time (recomputed in backward), so the
            (B, T, V) logits never exist; same values and gradients as the dense path. `null`:
            the dense logits. Models with a final logit transform use the dense path (warned).
            Policy modules only (a reward model scores one token per row).
        shared_prompt: rows that share a prompt (a preference pair, a GRPO/RLOO group, the
            rows of one prompt in a `SingleBatch`) are packed into one row
            `[prompt, completion_1, ..., completion_k]` with a block mask, so the prompt is
            computed once (`lit_rlhf.ops.shared_prompt`); same log-probs and gradients as the
            padded rows. Models whose attention takes no 4D mask (`flash_attention_2`) use the
            padded rows (warned). `false`: always the padded rows.
        frozen_placement: where frozen models (reference policy, reward model) live under a
            sharding strategy (DeepSpeed ZeRO-3): `partitioned` shards them across ranks with
            the trained weights (least memory; every forward all-gathers them), `whole` keeps a
            full copy on every rank (no communication; the N+ paper, Detail 8, keeps them
            unsharded under ZeRO-2 and offloads them to CPU, which this placement does not do).
            Without sharding both are the same. The DeepSpeed offload config also moves frozen
            weights to CPU when they are `partitioned`. Policy modules only.
        optimizer_in_backward: step each parameter with AdamW as soon as its gradient is complete
            in the backward pass and free that gradient, so the gradients of the whole model
            never exist at once (less peak memory). Same weights, optimizer state and checkpoints
            as the usual step (either resumes the other). One backward pass per optimizer step
            (online methods: `micro_batch_size` null or at least a minibatch), one process, no
            gradient clipping (`max_grad_norm: 0` for online methods), accumulation, DeepSpeed,
            fp16 or `on_nonfinite: skip` (refused at start-up). See `lit_rlhf.training.in_backward`.
        release_host_memory: on CPU, hand the heap the C library keeps after freeing tensors back
            to the system (glibc's `malloc_trim`, `lit_rlhf.host_memory`): `phases` after each
            optimizer step and before each backward pass, `layers` also before each decoder
            layer that runs with gradients (the forward pass and its recomputation under gradient
            checkpointing); `null`: never. A lower resident peak, no value changes; it costs the
            time to fault the pages in again, which grows with what a step allocates anew
            (`benchmarks/RESULTS.md`). No effect on GPU or without glibc.
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

    def apply_to(self, module: Any) -> None:
        """Keep each setting as the module's attribute of the same name (read at run time)."""
        for name, value in self.settings().items():
            setattr(module, name, value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Memory) and self.settings() == other.settings()

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.settings().items() if v != getattr(DEFAULTS, k, v)}
        return f"Memory({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


DEFAULTS = Memory()

# where a module's former memory arguments live now (`lit_rlhf.training.moved`)
MOVED = {name: f"use memory: {{{name}: ...}} (a `lit_rlhf.training.Memory` setting)" for name in FIELDS}
