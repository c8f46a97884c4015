"""Asynchronous rollouts in an online module: settings, the training step's hand-off, logs and
checkpoints (the machinery is `lit_rlhf.async_rollouts`).

With `max_staleness` set (an int >= 0), a producer samples the prompt batches ahead of the
learner with its own copy of the policy, and each training step takes its batch's responses from
the queue instead of sampling them; everything after sampling (log-probs, reference, values,
rewards, the rollout hooks, the update) is the synchronous step's. Lightning's fit loop stays in
charge: it hands the step its prompt batch as always, and the step checks that the responses it
takes were sampled for those prompts.

- **Versions and staleness.** The learner publishes its weights as version k at the start of
  step k (`lit_rlhf.generation.weight_sync`: in memory; a LoRA policy's adapter only); batch k is
  sampled with version max(0, k - max_staleness) (`lit_rlhf.async_rollouts.queue`).
  `max_staleness: 0` is the synchronous run, bitwise; 1 is one-step-off overlap (sampling batch
  k + 1 while the learner trains on batch k).
- **Off-policy correction.** A stale sample's tokens were drawn by older weights. The update's
  "old" log-probs are the learner's current ones (the proximal policy), so its clipped ratio
  starts at 1, and the truncated importance weight `min(pi_current / pi_sampler, tis_cap)`
  (`lit_rlhf.losses.tis`) corrects for the sampler: the decoupled PPO objective (Hilton et al.
  2022, as AReaL uses it for stale samples) with a truncated behaviour weight. It is on by
  default when `max_staleness` > 0 (`tis_cap` ASYNC_TIS_CAP unless set; `tis_cap: 0` turns it off).
- **Exact resume.** A checkpoint at step k holds the batches scheduled for weights older than
  version k, which it could not regenerate (`RolloutQueue.checkpoint_batches`: the save waits for
  the producer to finish them); the batches that need version k or newer are sampled again after
  the resume, the same tokens (their random streams are functions of the seed and the batch
  index). The data order is the fit loop's own (`ResumableSampler`). With the `hf` sampler a
  resumed run is the uninterrupted one, bitwise (tested). A vLLM server batches concurrent
  requests as they arrive, and a row's log-probs change in their last bits with its batch-mates
  (its tokens too, where two are nearly tied): with `server_concurrency: 1` each request runs
  alone and a resumed run is bitwise the uninterrupted one (tested on CPU).
- **Logs**: `train/async/staleness_mean` and `staleness_max` (versions behind, over the batch's
  rows); `train/rollout/sampler_logprob_diff(_max)`, the gap between the sampler's log-probs and
  the learner's (staleness included); and, depending on timing, `train/perf/queue_depth` (finished
  batches waiting when the step asked), `train/perf/trainer_idle_fraction` (the share of the
  training step spent waiting for the batch), `train/time/rollout_wait` and
  `train/time/rollout_sampling` (the producer's seconds for the batch).

**Where it samples** (`generation_backend`): `hf`, our sampler on a copy of the policy in a
thread of this process (`LocalSampler`); `vllm_server`, a vLLM engine in its own process
(`lit_rlhf.generation.server`): started here from the policy as it is at the start of the fit
and stopped at its end, or the one at `server_url` (`python -m lit_rlhf.generation.server`), the
producer pushing each version to it (`ServerSampler`; LoRA: the adapter only). Validation samples
with the trainer's own policy (`hf`) in both cases.

Limits: one process (no DDP yet), GRPO and PPO (the methods with truncated importance sampling),
no dynamic sampling, and a train loader whose order is a function of (seed, epoch)
(`lit_rlhf.async_rollouts.prompts`).
"""

from __future__ import annotations

import copy
import logging
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning import Callback
from torch import Tensor

from lit_rlhf.async_rollouts import (
    GeneratedBatch,
    LocalSampler,
    PromptSchedule,
    RolloutProducer,
    RolloutQueue,
    staleness_stats,
)
from lit_rlhf.generation.weight_sync import InMemoryWeightSync, WeightSync, trained_weights
from lit_rlhf.modules.base import CHECKPOINT_KEY
from lit_rlhf.types import PromptBatch

log = logging.getLogger(__name__)

ASYNC_TIS_CAP = 2.0
"""The truncation of the importance weights when `max_staleness` > 0 and `tis_cap` is not set
(C = 2, as in Yao et al. 2025's truncated importance sampling)."""
STATE_KEY = "async_rollouts"


def effective_tis_cap(tis_cap: float | None, generation_backend: str, max_staleness: int | None,
                      async_timeout: float) -> float | None:
    """Check the asynchronous settings and return the truncation the update uses (None = off):
    `tis_cap` as given, `ASYNC_TIS_CAP` when it is None and `max_staleness` > 0, None for 0."""
    if max_staleness is not None and max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0 or null (synchronous), got {max_staleness}")
    if not async_timeout > 0:
        raise ValueError(f"async_timeout must be > 0 seconds, got {async_timeout}")
    if tis_cap is not None and tis_cap < 0:
        raise ValueError(f"tis_cap must be > 0 (0 = off, null = the default), got {tis_cap}")
    if tis_cap is None and max_staleness:  # stale samples: the off-policy correction on by default
        tis_cap = ASYNC_TIS_CAP
    tis_cap = tis_cap or None  # 0: off
    if tis_cap is not None and generation_backend != "vllm" and max_staleness is None:
        raise ValueError(f"tis_cap (got {tis_cap}) needs a sampler other than the trainer: generation_backend "
                         f"'vllm' or max_staleness (got {generation_backend!r} and no max_staleness)")
    return tis_cap


class AsyncRollouts:
    """The running parts: the queue, the producer, the weight sync and what was published."""

    def __init__(self, queue: RolloutQueue, producer: RolloutProducer, sync: WeightSync) -> None:
        self.queue, self.producer, self.sync = queue, producer, sync
        self.published: int | None = None

    def stop(self) -> None:
        self.producer.stop()


class AsyncRolloutGuard(Callback):
    """Stops an online module's producer when the fit ends on an exception or tears down
    (Lightning calls no module hook on an exception)."""

    def on_exception(self, trainer, pl_module, exception) -> None:
        stop = getattr(pl_module, "stop_async_rollouts", None)
        if stop is not None:
            stop()

    def teardown(self, trainer, pl_module, stage) -> None:
        self.on_exception(trainer, pl_module, None)


class AsyncRolloutMixin:
    """The asynchronous side of `OnlineModule` (see the module docstring)."""

    max_staleness: int | None = None
    """None: synchronous rollouts (sampled in the training step). An int s >= 0: asynchronous,
    every consumed sample at most s policy versions old."""
    async_timeout: float = 600.0
    """Seconds the learner waits for a batch (and a checkpoint for the batches it must hold), a
    vLLM server takes to start, and any one call to it."""
    server_url: str | None = None
    """`generation_backend: vllm_server`: the server to sample from; None = start one."""
    weight_transfer: str = "file"
    """`generation_backend: vllm_server`: how full weights reach the server: `file` (a stamped
    safetensors file: one machine, or a shared disk) or `nccl` (GPUs, `generation.server_nccl`)."""
    _async: AsyncRollouts | None = None
    _async_restored: dict[str, Any] | None = None

    def init_async(self, max_staleness: int | None, async_timeout: float, server_url: str | None,
                   weight_transfer: str, generation_backend: str, tis_cap: float | None,
                   server_concurrency: int = 64) -> float | None:
        """In `__init__`: check and keep the asynchronous settings (`OnlineModule`'s arguments);
        returns the `tis_cap` the update uses (`effective_tis_cap`)."""
        tis_cap = effective_tis_cap(tis_cap, generation_backend, max_staleness, async_timeout)
        if generation_backend == "vllm_server" and max_staleness is None:
            raise ValueError("generation_backend 'vllm_server' samples asynchronous rollouts: set max_staleness "
                             "(0 = in lockstep with the learner)")
        if weight_transfer not in ("file", "nccl"):
            raise ValueError(f"weight_transfer must be 'file' or 'nccl', got {weight_transfer!r}")
        if int(server_concurrency) < 1:
            raise ValueError(f"server_concurrency must be >= 1, got {server_concurrency}")
        self.max_staleness, self.async_timeout = max_staleness, float(async_timeout)
        self.server_url, self.weight_transfer = server_url, weight_transfer
        self.server_concurrency = int(server_concurrency)
        return tis_cap

    @property
    def asynchronous(self) -> bool:
        return self.max_staleness is not None

    def async_problems(self, trainer: Any) -> list[str]:
        """Why this configuration cannot run asynchronously (empty when it can or is synchronous)."""
        if not self.asynchronous:
            return []
        problems = []
        if not getattr(self, "supports_tis", False):
            problems.append(f"max_staleness: asynchronous rollouts are for GRPO and PPO (the methods with an "
                            f"off-policy correction), not {type(self).__name__}")
        if getattr(self, "importance_sampling", "token") == "sequence" and self.tis_cap is not None:
            problems.append("max_staleness: GSPO (importance_sampling 'sequence') has no per-token off-policy "
                            "correction for stale samples; set tis_cap: 0 to train on them uncorrected")
        if getattr(self, "dynamic_sampling", False):
            problems.append("max_staleness: dynamic sampling draws extra prompts inside the step; it is not "
                            "available with asynchronous rollouts")
        if self.generation_backend not in ("hf", "vllm_server"):
            problems.append(f"max_staleness: asynchronous rollouts sample with generation_backend 'hf' or "
                            f"'vllm_server', got {self.generation_backend!r}")
        if getattr(self, "environment", None) is not None:
            problems.append("max_staleness: asynchronous rollouts sample one response per prompt; multi-turn "
                            "episodes (environment) run synchronously: leave max_staleness null")
        if trainer is not None and trainer.world_size > 1:
            problems.append(f"max_staleness: asynchronous rollouts run on one process, the trainer has "
                            f"{trainer.world_size}")
        return problems

    # ------------------------------------------------------------------------------------------
    # Lightning hooks (this mixin comes first in `OnlineModule`'s bases: each calls super())
    # ------------------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        super().setup(stage)  # the start-up checks (`async_problems` among them, `check_config`)
        trainer = self._trainer
        if stage == "fit" and self.asynchronous and trainer is not None:
            if not any(isinstance(cb, AsyncRolloutGuard) for cb in trainer.callbacks):
                trainer.callbacks.append(AsyncRolloutGuard())  # stops the producer if the fit fails

    def on_train_start(self) -> None:
        super().on_train_start()  # the random states first (a producer at max_staleness 0 draws from them)
        if self.asynchronous and not self.trainer.should_stop:  # nothing to sample when the budget is met
            self.start_async_rollouts()

    def on_train_end(self) -> None:
        super().on_train_end()
        self.stop_async_rollouts()  # after the callbacks' on_train_end (the last checkpoint)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.asynchronous:
            checkpoint[CHECKPOINT_KEY][STATE_KEY] = self.async_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._async_restored = checkpoint.get(CHECKPOINT_KEY, {}).get(STATE_KEY)

    # ------------------------------------------------------------------------------------------
    # start and stop
    # ------------------------------------------------------------------------------------------

    def start_async_rollouts(self) -> None:
        """Build the queue (with a checkpoint's batches), the sampler's copy of the policy and the
        producer, and start it (from `on_train_start`, after the random states are restored)."""
        self.stop_async_rollouts()
        trainer = self.trainer
        s, k = int(self.max_staleness), int(self.rollouts)
        restored, self._async_restored = self._async_restored, None
        if restored is not None and int(restored["max_staleness"]) != s:
            raise ValueError(f"the checkpoint was written by an asynchronous run with max_staleness "
                             f"{restored['max_staleness']}; resume it with the same max_staleness (got {s})")
        batches = [GeneratedBatch.from_state(b) for b in (restored or {}).get("batches") or []]
        min_version = 0
        if k > 0 and restored is None:
            min_version = k
            log.warning("resuming an asynchronous run from a checkpoint without its rollout queue (a synchronous "
                        "run's): the first batches are sampled with the checkpoint's weights (staleness below %d)", s)
        queue = RolloutQueue(s, next_index=k, min_version=min_version)
        queue.restore(batches)
        schedule = PromptSchedule(trainer.train_dataloader, trainer.num_training_batches)
        sync = InMemoryWeightSync()
        if self.generation_backend == "vllm_server":
            sampler = self.server_sampler(sync)
        else:
            sampler = LocalSampler(copy.deepcopy(self.policy), sync, self.sampling, self.repeats,
                                   self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, s)
        self._async = AsyncRollouts(queue, RolloutProducer(queue, schedule, sampler).start(), sync)

    def server_sampler(self, sync: WeightSync):
        """The producer's sampler on a vLLM server: the one at `server_url`, or one started here
        from the policy as it is now (its frozen base for LoRA), stopped with the producer."""
        from lit_rlhf.async_rollouts.server_sampler import ServerSampler, save_server_model
        from lit_rlhf.generation.server import ServerClient, VLLMServer
        from lit_rlhf.models import adapters

        lora = self.policy.peft_config[adapters.POLICY] if self.lora_config is not None else None
        nccl = self.weight_transfer == "nccl" and lora is None  # a LoRA adapter goes as a file
        owned = None
        if self.server_url:
            server = VLLMServer(self.server_url)
            model = ServerClient(server, "", timeout=self.async_timeout).request("GET", "/v1/models")["data"][0]["id"]
        else:
            workdir = tempfile.TemporaryDirectory(prefix="lit_rlhf_server_model_")
            save_server_model(self.policy, self.tokenizer, Path(workdir.name))
            trainer = self.trainer
            log_path = Path(trainer.log_dir or trainer.default_root_dir) / "vllm_server.log"
            # the policy's dtype (vLLM would serve a float32 model in bfloat16 on CPU) and length
            engine_args = {"dtype": str(next(self.policy.parameters()).dtype).removeprefix("torch."),
                           "max_model_len": min(int(getattr(self.policy.config, "max_position_embeddings", 2048)), 4096),
                           **self.vllm_kwargs}
            server = owned = VLLMServer.start(workdir.name, log_path, startup_timeout=self.async_timeout,
                                              lora_rank=None if lora is None else int(lora.r), nccl=nccl,
                                              **engine_args)
            server.workdir = workdir  # removed with the server object
            model = workdir.name
        client = ServerClient(server, model, timeout=self.async_timeout, max_concurrency=self.server_concurrency)
        sender = None
        if nccl:
            from lit_rlhf.generation.server_nccl import NCCLWeightSender

            sender = NCCLWeightSender(client, timeout=self.async_timeout)
        return ServerSampler(client, sync, self.sampling, self.repeats, self.tokenizer.eos_token_id,
                             self.tokenizer.pad_token_id, int(self.max_staleness), lora, owned, nccl_sender=sender)

    def stop_async_rollouts(self) -> None:
        running, self._async = self._async, None
        if running is not None:
            running.stop()

    # ------------------------------------------------------------------------------------------
    # the training step's hand-off
    # ------------------------------------------------------------------------------------------

    def take_generated(self, batch: PromptBatch) -> tuple[GeneratedBatch, dict[str, Tensor]]:
        """Publish the current weights (version = rollouts trained on), then take this step's
        batch from the queue and check it was sampled for `batch`'s prompts -> (batch, stats)."""
        state = self._async
        if state is None:
            raise RuntimeError("asynchronous rollouts are not running: they start in on_train_start")
        k = int(self.rollouts)
        if state.published is None or state.published < k:
            state.sync.publish(k, trained_weights(self.policy))
            state.published = k
        generated, depth, waited = state.queue.take(k, self.async_timeout)
        ids, mask = batch.input_ids, batch.attention_mask.bool()
        same = generated.prompt_ids.shape == ids.shape and torch.equal(generated.prompt_ids.to(ids.device), ids) \
            and torch.equal(generated.prompt_mask.to(ids.device), mask)
        if not same:
            raise RuntimeError(f"rollout {k}: the fit loop's prompt batch is not the one the producer sampled for "
                               "it; the train loader's order must be a function of (seed, epoch) and the fit loop "
                               "must take every batch of an epoch (lit_rlhf.async_rollouts.prompts)")
        stats = staleness_stats(generated, k)
        # what depends on timing goes with the other wall-clock metrics (`time/`, `perf/`)
        stats.update({"perf/queue_depth": torch.tensor(float(depth)), "time/rollout_wait": torch.tensor(waited),
                      "time/rollout_sampling": torch.tensor(generated.seconds)})
        return generated, stats

    # ------------------------------------------------------------------------------------------
    # checkpoints
    # ------------------------------------------------------------------------------------------

    def async_state(self) -> dict[str, Any] | None:
        """What a checkpoint holds of the queue (None when the run is synchronous or not running; the
        loaded checkpoint's when the producer was never started: a resumed run with its budget met)."""
        state = self._async
        if state is None:
            return self._async_restored
        if not state.producer.running:
            return None
        batches = state.queue.checkpoint_batches(self.async_timeout)
        return {"max_staleness": int(self.max_staleness), "next_index": state.queue.next_index,
                "batches": [b.state() for b in batches]}
