"""Online settings that moved from a method's constructor to its rollout source or to a variant,
and where to (`moved_options`; the one-line error is `lit_rlhf.training.moved`'s).
"""

from __future__ import annotations

MOVED = {name: f"use {place} (the rollout source)" for name, place in {
    "generation_backend": "rollout: {class_path: lit_rlhf.online.VLLMSampler} (hf: the default HFSampler; "
                          "vllm_server: AsyncRollouts with server: {class_path: lit_rlhf.online.VLLMServerBackend})",
    "vllm_kwargs": "rollout: {class_path: lit_rlhf.online.VLLMSampler, init_args: {engine_kwargs: ...}} "
                   "(or VLLMServerBackend's engine_kwargs)",
    "tis_cap": "VLLMSampler(tis_cap=...) or AsyncRollouts(tis_cap=...), or their correction: {mode, level, ...}",
    "environment": "rollout: {class_path: lit_rlhf.online.EnvironmentRollouts, init_args: {environment: ...}}",
    "max_turns": "EnvironmentRollouts(max_turns=...)",
    "max_episode_tokens": "EnvironmentRollouts(max_episode_tokens=...)",
    "max_staleness": "rollout: {class_path: lit_rlhf.online.AsyncRollouts, init_args: {max_staleness: ...}}",
    "async_timeout": "AsyncRollouts(timeout=...)",
    "server_url": "AsyncRollouts(server=VLLMServerBackend(url=...))",
    "weight_transfer": "AsyncRollouts(server=VLLMServerBackend(weight_transfer=...))",
    "server_concurrency": "AsyncRollouts(server=VLLMServerBackend(concurrency=...))",
}.items()}

# GRPOModule's former options that now belong to a variant
GRPO_MOVED = {
    "advantage": "use ReinforcePPModule for reinforce_pp (baseline: true for reinforce_pp_baseline), RLOOModule for "
                 "leave-one-out; GRPOModule's advantages are group-normalised (scale: group, batch or none)",
    "importance_sampling": "use GSPOModule",
    "dynamic_sampling": "use DAPOModule",
    "max_sampling_rounds": "use DAPOModule",
    "mask_truncated": "use DAPOModule",
    "eps": "the class attribute `eps` (GRPO 1e-4, Dr. GRPO 0, REINFORCE++ 1e-8): a subclass sets another",
    "entropy_control": "use entropy: {covariance: {method: ..., ...}} (a lit_rlhf.losses.EntropyControl)",
    "entropy_bonus": "use entropy: {bonus: {coef: ..., ...}} (a lit_rlhf.losses.EntropyControl)",
}
