"""A weight sync that proves itself: after every sync the engine scores a fixed probe and its
log-probs are compared with the trainer's of the same tokens.

A sync that loads nothing (a renamed key, a LoRA adapter never merged, a dtype cast gone wrong)
otherwise leaves every version counter right while the engine samples from stale weights. The
probe (`SyncProbe`) is a few rows of token ids drawn once per run from its seed; the trainer's
log-probs of their last `tokens` ids travel with the version (`stamp`, a tensor named
`PROBE_KEY` beside the weights, so the file and in-memory syncs carry it unchanged), the engine
that holds the probe scores the same ids after loading and `check` raises `SyncCheckError`, naming
the sync, the version and the worst token, when their mean absolute difference exceeds `bound`
nats. Default bounds, by the trainer's dtype, measured on CPU against vLLM's engine
(`benchmarks/bench_sync_probe.py`, `benchmarks/results/sync_probe_cpu.json`, 40 probes): 1e-3 in
float32, where a healthy sync of SmolLM2-135M differs by <= 1.3e-5 and one that drops a tensor of
a small update by >= 0.008 (a bf16 cast of the test model: 0.02; a dropped layer: 1); 0.5 in half
precision, where the two sides' kernels round differently: a healthy bf16 sync of SmolLM2-135M
differs by 0.06-0.20 per probe (tokens: 99% below 0.32, max 0.69; 0.1 stops 7 of 40), so 0.5 is
2.5x the largest and catches gross failures only (a version never loaded, an adapter never
applied). The seconds of the last check are `seconds` (logged as `time/weight_sync_check`).
"""

from __future__ import annotations

import time

import torch
from torch import Tensor, nn

from lit_rlhf.generation.weight_sync import PROBE_KEY, WeightSyncError
from lit_rlhf.models import adapters
from lit_rlhf.models.logprobs import response_logps


class SyncCheckError(WeightSyncError):
    """After a sync, the engine's log-probs of the probe are not the trainer's."""


class SyncProbe:
    """`rows` sequences of `prompt + tokens` token ids below `vocab_size`, drawn once from `seed`
    (see the module docstring); `bound`: None = by the engine's dtype; `retry`: an engine that
    finds a difference sends every weight again once before raising."""

    def __init__(self, vocab_size: int, rows: int = 2, prompt: int = 8, tokens: int = 4, seed: int = 0,
                 bound: float | None = None, retry: bool = False) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(0, vocab_size, (rows, prompt + tokens), generator=generator)  # (n, P+R)
        self.tokens, self.bound, self.retry, self.seconds = tokens, bound, retry, 0.0

    @torch.no_grad()
    def logps(self, model: nn.Module) -> Tensor:
        """Log-probs (n, tokens) float32 of the probe's last tokens under a causal LM (temperature 1,
        full vocabulary, in the weights' own dtype: autocast off; a LoRA `AdapterView` with its
        adapter on)."""
        with adapters.activated(model) as module:
            device = next(module.parameters()).device
            ids = self.input_ids.to(device)
            was_training = module.training
            module.eval()
            try:
                with torch.autocast(device.type, enabled=False):
                    return response_logps(module, ids, torch.ones_like(ids, dtype=torch.bool), self.tokens).float().cpu()
            finally:
                module.train(was_training)

    def stamp(self, tensors: dict[str, Tensor], trainer: nn.Module) -> dict[str, Tensor]:
        """`tensors` with the trainer's probe log-probs added (the learner's side of a sync)."""
        return {**tensors, PROBE_KEY: self.logps(trainer)}

    def check(self, sync: str, version: int | None, expected: Tensor, engine: Tensor, dtype: torch.dtype,
              started: float | None = None) -> float:
        """Raise `SyncCheckError` when `engine` (n, tokens) differs from `expected` by more than the
        bound on average; returns the mean absolute difference. `started`: `time.perf_counter()` when the
        check began (its seconds are kept in `seconds`)."""
        bound = self.bound if self.bound is not None else (1e-3 if dtype in (torch.float32, torch.float64) else 0.5)
        diff = (engine.float().cpu() - expected.float().cpu()).abs().nan_to_num(float("inf"))  # (n, tokens)
        worst = int(diff.argmax())
        row, col = divmod(worst, diff.shape[1])
        self.seconds = 0.0 if started is None else time.perf_counter() - started
        if not float(diff.mean()) <= bound:
            token = int(self.input_ids[row, -self.tokens + col])
            raise SyncCheckError(
                f"{sync}: after the sync of version {version} the engine's log-probs of the probe differ from the "
                f"trainer's by {float(diff.mean()):.3g} nats per token (bound {bound:g}); worst: row {row}, probe token "
                f"{col} (id {token}): trainer {float(expected.flatten()[worst]):.6f}, engine {float(engine.flatten()[worst]):.6f}")
        return float(diff.mean())

    def verify_model(self, sync: str, version: int | None, model: nn.Module, expected: Tensor) -> float:
        """`check` of an HF model that just received a version (scored here) against `expected`."""
        started = time.perf_counter()
        return self.check(sync, version, expected, self.logps(model), next(model.parameters()).dtype, started)
