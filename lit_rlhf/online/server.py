"""A vLLM server as the sampler of asynchronous rollouts: its settings and how the producer reaches it.

`AsyncRollouts(server=VLLMServerBackend(...))` samples on a vLLM engine in its own process
(`lit_rlhf.generation.server`): the one at `url` (`python -m lit_rlhf.generation.server`), or
one started from the policy as it is at the start of the fit and stopped with the producer. The
producer pushes each policy version to it (`lit_rlhf.async_rollouts.server_sampler.ServerSampler`;
a LoRA policy: its adapter, as a file).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal

from lightning import Trainer

from lit_rlhf.generation import SamplingConfig
from lit_rlhf.generation.weight_sync import WeightSync
from lit_rlhf.online.sources import SampledModel


class VLLMServerBackend:
    """Where and how asynchronous rollouts reach a vLLM server.

    Args:
        url: the running server to sample from; None = the trainer starts one (its log:
            `vllm_server.log` in the run's log directory).
        weight_transfer: how full weights reach the server: `file` (a safetensors file stamped with
            its version: one machine or a shared disk) or `nccl` (GPUs: vLLM's NCCL weight
            transfer, `lit_rlhf.generation.server_nccl`); a LoRA adapter always goes as a file.
        concurrency: completion requests kept in flight (the engine batches them); 1 runs them one
            at a time, so a row's numerics never depend on its batch-mates and a resumed run is the
            uninterrupted one bitwise (tested).
        engine_kwargs: for a server the trainer starts, its engine's settings as command-line flags
            (`lit_rlhf.generation.server.server_command`: `max_model_len`, `gpu_memory_utilization`).
    """

    def __init__(self, url: str | None = None, weight_transfer: Literal["file", "nccl"] = "file", concurrency: int = 64,
                 engine_kwargs: dict[str, Any] | None = None) -> None:
        if weight_transfer not in ("file", "nccl"):
            raise ValueError(f"weight_transfer must be 'file' or 'nccl', got {weight_transfer!r}")
        if int(concurrency) < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.url, self.weight_transfer = url, weight_transfer
        self.concurrency, self.engine_kwargs = int(concurrency), dict(engine_kwargs or {})

    def sampler(self, model: SampledModel, trainer: Trainer, sampling: SamplingConfig, repeats: int, sync: WeightSync,
                max_staleness: int, timeout: float, probe: Any = None):
        """The producer's sampler of `model` (the policy) on the server at `url`,
        or on one started here from it as it is now (its frozen base for LoRA), stopped with the
        producer; `repeats` responses per prompt; `probe` checks every version pushed."""
        from lit_rlhf.async_rollouts.server_sampler import ServerSampler, save_server_model
        from lit_rlhf.generation.server import ServerClient, VLLMServer

        policy, tokenizer = model.model, model.tokenizer
        dtype = next(policy.parameters()).dtype
        lora = policy.peft_config[model.adapter] if model.adapter is not None else None
        nccl = self.weight_transfer == "nccl" and lora is None  # a LoRA adapter goes as a file
        owned = None
        if self.url:
            server = VLLMServer(self.url)
            model = ServerClient(server, "", timeout=timeout).request("GET", "/v1/models")["data"][0]["id"]
        else:
            workdir = tempfile.TemporaryDirectory(prefix="lit_rlhf_server_model_")
            save_server_model(policy, tokenizer, Path(workdir.name))
            log_path = Path(trainer.log_dir or trainer.default_root_dir) / "vllm_server.log"
            # the policy's dtype (vLLM would serve a float32 model in bfloat16 on CPU) and length
            engine_args = {"dtype": str(dtype).removeprefix("torch."),
                           "max_model_len": min(int(getattr(policy.config, "max_position_embeddings", 2048)), 4096),
                           **self.engine_kwargs}
            server = owned = VLLMServer.start(workdir.name, log_path, startup_timeout=timeout,
                                              lora_rank=None if lora is None else int(lora.r), nccl=nccl,
                                              **engine_args)
            server.workdir = workdir  # removed with the server object
            model = workdir.name
        client = ServerClient(server, model, timeout=timeout, max_concurrency=self.concurrency)
        sender = None
        if nccl:
            from lit_rlhf.generation.server_nccl import NCCLWeightSender

            sender = NCCLWeightSender(client, timeout=timeout)
        return ServerSampler(client, sync, sampling, repeats, tokenizer.eos_token_id,
                             tokenizer.pad_token_id, int(max_staleness), lora, owned, nccl_sender=sender, probe=probe,
                             dtype=dtype)
