"""The producer's sampler on a vLLM server in its own process (`AsyncRollouts(server=VLLMServerBackend(...))`).

The learner publishes each version in memory (as for `LocalSampler`); the producer thread takes
the version a batch is scheduled for, pushes it to the server before sampling and checks it (the
server scores the learner's probe, `generation.sync_check`), so the learner never waits for a transfer:

- full fine-tuning: the trained parameters as one safetensors file stamped with the version
  (`FileWeightSync`, two files kept), loaded in place by the server's worker;
- LoRA: the policy adapter alone, written in PEFT format and served as its own LoRA model
  (`policy-v{version}`); the server holds the frozen base.

Rows draw their seeds as `LocalSampler` draws its tokens: from torch's global generator with
`max_staleness: 0`, else from batch k's own generator (`rollout_seed`).
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlhf.async_rollouts.producer import Sampler
from lit_rlhf.async_rollouts.queue import GeneratedBatch, stack_versions
from lit_rlhf.generation import SamplingConfig
from lit_rlhf.generation.server import ServerClient, VLLMServer
from lit_rlhf.generation.weight_sync import FileWeightSync, WeightSync
from lit_rlhf.models import adapters


def write_adapter(directory: Path, tensors: dict[str, Tensor], config: Any, adapter: str = adapters.POLICY) -> None:
    """The adapter's tensors (names as the training model has them) in PEFT's on-disk format."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(config)
    config.inference_mode = True
    config.save_pretrained(str(directory))
    renamed = {n.replace(f"modules_to_save.{adapter}.", "").replace(f".{adapter}.", "."): t.detach().cpu().contiguous()
               for n, t in tensors.items()}
    save_file(renamed, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})


def save_server_model(policy: nn.Module, tokenizer, directory: Path) -> None:
    """What the server starts from: the policy as it is (full), or its frozen base (LoRA)."""
    if adapters.adapter_names(policy):
        base = copy.deepcopy(policy)
        adapters.forget_layers(base)
        base = base.unload()  # the base without any adapter, not merged
        base.save_pretrained(str(directory), safe_serialization=True)
    else:
        policy.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))


class ServerSampler(Sampler):
    """Samples on a vLLM server, pushing each scheduled version to it first (module docstring).

    Args:
        client: the server's client (`lit_rlhf.generation.server`).
        sync: where the learner publishes its versions (in memory).
        sampling, repeats, eos_token_id, pad_token_id, max_staleness: as `LocalSampler`.
        lora_config: the policy adapter's `peft` config when the policy is a LoRA model.
        owned_server: a server this sampler started (it stops it on `close`).
        workdir: where the weight files and adapters go (None: a temporary directory).
        nccl_sender: a `server_nccl.NCCLWeightSender` to send full weights over NCCL instead of files.
        probe: the learner's `SyncProbe`: after each push the server scores it (`Sampler`).
        dtype: the policy's dtype (the probe's bound follows it).
    """

    def __init__(self, client: ServerClient, sync: WeightSync, sampling: SamplingConfig, repeats: int,
                 eos_token_id: int, pad_token_id: int, max_staleness: int, lora_config: Any = None,
                 owned_server: VLLMServer | None = None, workdir: str | Path | None = None,
                 nccl_sender: Any = None, probe: Any = None, dtype: torch.dtype = torch.float32) -> None:
        self.client, self.sync, self.sampling, self.repeats = client, sync, sampling, repeats
        self.eos_token_id, self.pad_token_id, self.max_staleness = eos_token_id, pad_token_id, max_staleness
        self.lora_config, self.owned_server, self.nccl_sender = lora_config, owned_server, nccl_sender
        self.probe, self.dtype = probe, dtype
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="lit_rlhf_server_sync_")
        self.workdir = Path(workdir if workdir is not None else self._tmp.name)
        self.files = FileWeightSync(self.workdir / "weights", keep=2)
        self.model_name: str | None = None  # the LoRA model the server samples (None: the full model)
        self.version = None

    @property
    def transport(self) -> str:
        return "LoRA adapter" if self.lora_config is not None else "NCCL" if self.nccl_sender is not None else "file"

    def load(self, version: int, tensors: dict[str, Tensor]) -> None:
        """Send `version` to the server (a stamped file, an NCCL broadcast, or a LoRA adapter of its own)."""
        if self.transport == "NCCL":
            self.nccl_sender.push(version, tensors)
        elif self.transport == "file":
            if not self.files.path(version).exists():  # else: loaded again (a retry)
                self.files.publish(version, tensors)
            self.client.load_weights_file(self.files.path(version), version)
        else:
            path = self.workdir / f"adapter-v{version}"
            write_adapter(path, tensors, self.lora_config)
            name, previous = f"policy-v{version}", self.model_name
            self.client.load_adapter(path, name, previous)
            self.client.set_weight_version(version)
            self.model_name = name
            if previous not in (None, name):
                shutil.rmtree(self.workdir / f"adapter-v{previous.rsplit('-v', 1)[1]}", ignore_errors=True)

    def check(self, version: int, expected: Tensor) -> None:
        self.client.check_probe(self.probe, version, expected, self.dtype, self.model_name,
                                f"vLLM server sync ({self.transport})")

    @torch.no_grad()
    def sample(self, index: int, version: int, prompts: Any) -> GeneratedBatch:
        prompt_ids, prompt_mask, ids, mask, generator = self.rows(index, version, prompts)
        seeds = torch.randint(0, 2**62, (ids.shape[0],), generator=generator).tolist()
        response_ids, response_mask, has_eos, logps = self.client.generate(
            ids, mask, self.sampling, self.eos_token_id, self.pad_token_id, seeds, model=self.model_name)
        return GeneratedBatch(index, version, prompt_ids, prompt_mask, response_ids, response_mask, has_eos, logps,
                              stack_versions(version, ids.shape[0]))

    def close(self) -> None:
        super().close()
        if self.nccl_sender is not None:
            self.nccl_sender.close()
        if self.owned_server is not None:
            self.owned_server.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
