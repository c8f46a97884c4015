"""Online settings that moved from a method's constructor to its rollout source, and where to.

A config or a script written for the method-level settings (`generation_backend: vllm`,
`max_staleness: 1`, `environment: ...`) stops with one line naming the new place, from Python
(`refuse_moved_settings`, called by `OnlineModule.__init__`) and from the command line
(`lit_rlhf.cli_errors`, which reads `MOVED`).
"""

from __future__ import annotations

from typing import Any

MOVED = {
    "generation_backend": "rollout: {class_path: lit_rlhf.online.VLLMSampler} (hf: the default HFSampler; "
                          "vllm_server: AsyncRollouts with server: {class_path: lit_rlhf.online.VLLMServerBackend})",
    "vllm_kwargs": "rollout: {class_path: lit_rlhf.online.VLLMSampler, init_args: {engine_kwargs: ...}} "
                   "(or VLLMServerBackend's engine_kwargs)",
    "tis_cap": "the rollout source: VLLMSampler(tis_cap=...) or AsyncRollouts(tis_cap=...)",
    "environment": "rollout: {class_path: lit_rlhf.online.EnvironmentRollouts, init_args: {environment: ...}}",
    "max_turns": "EnvironmentRollouts(max_turns=...)",
    "max_episode_tokens": "EnvironmentRollouts(max_episode_tokens=...)",
    "max_staleness": "rollout: {class_path: lit_rlhf.online.AsyncRollouts, init_args: {max_staleness: ...}}",
    "async_timeout": "AsyncRollouts(timeout=...)",
    "server_url": "AsyncRollouts(server=VLLMServerBackend(url=...))",
    "weight_transfer": "AsyncRollouts(server=VLLMServerBackend(weight_transfer=...))",
    "server_concurrency": "AsyncRollouts(server=VLLMServerBackend(concurrency=...))",
}


def moved_message(owner: str, key: str) -> str:
    return f"{owner}: `{key}` moved to the rollout source: use {MOVED[key]}"


def refuse_moved_settings(owner: str, kwargs: dict[str, Any]) -> None:
    """Raise a one-line error for the first moved setting in `kwargs`."""
    for key in kwargs:
        if key in MOVED:
            raise TypeError(moved_message(owner, key))
