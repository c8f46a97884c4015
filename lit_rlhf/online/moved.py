"""Online settings that moved from a method's constructor to its rollout source, and where to
(`OnlineModule.moved_options`; the one-line error is `lit_rlhf.training.moved`'s).
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
