"""Where a LoRA DPO step's memory goes (memory only):

    python -m benchmarks.bench_lora_phases --model smollm2-135m-instruct --batch-size 2 \
        --prompt-length 64 --completion-length 16 --json benchmarks/results/lora_dpo_phases.json

(`python -m benchmarks.bench_lora --phases ...` runs the same.) The workload is `bench_dpo.py`'s
(same rows, lengths, seeds, learning rate; its flags after ours), with the LoRA of
`bench_lora.py` (`--lora-r`, `--lora-alpha`, all linear layers). It runs, each in its own process,
`lora` (our `DPOModule` with LoRA, fitted by a plain Lightning Trainer), `trl_lora` (TRL's
`DPOTrainer` in `--trl-python` with `peft_config`, its reference the adapter-free base) and
`bare` (the floor: the same LoRA model, data and log-prob path in plain torch, without
Lightning or a module: reference forward without grad, policy forward, DPO loss, backward,
fused AdamW). Each reports its resident memory after the imports (the runtime), after building
the model and at the start of the measured step (with how much freed memory glibc's malloc held
then), and for each phase of that step (`PhaseMeter`: step start, policy forward, reference
forward, loss, backward, optimizer step) the resident size at its start and its peak. With
`--tensors` a further step runs under `torch.profiler(profile_memory=True)` and torch's memory
profiler splits the live tensor bytes at each phase's peak into parameters, optimizer state,
inputs, activations, gradients, temporaries and autograd detail (`tensor_phases`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

from benchmarks.common import REPO, parse_config, setup_worker
from benchmarks.lora_common import lora_parser, lora_spec, parse_lora_args, peft_config, write_json
from benchmarks.phase_memory import PhaseMeter, malloc_totals_mb, profiled_step_start, status_mb, tensor_phases, wrap_phase
from lit_rlhf.training.memory import Memory

PHASE_VARIANTS = ("lora", "trl_lora", "bare")


def _phase_rows(cfg):
    from benchmarks.common import preference_batch, step_rows

    def batches(tokenizer):
        return [preference_batch(rows) for rows in step_rows(cfg, tokenizer)]

    return batches


def phases_lora(cfg, spec: dict[str, Any], tensors: bool) -> dict[str, Any]:
    """Our `DPOModule` with LoRA, fitted by a plain Lightning Trainer as `common.fit_ours` does."""
    import lightning as L
    from torch.utils.data import DataLoader

    from benchmarks import bench_dpo
    from lit_rlhf.modules import DPOModule

    out: dict[str, Any] = {"rss_runtime_mb": status_mb("VmRSS")}
    module = DPOModule(model=cfg.model, beta=bench_dpo.BETA, lr=bench_dpo.LR, lr_scheduler="cosine", lora=spec,
                       memory=Memory(gradient_checkpointing=cfg.gradient_checkpointing))
    out["rss_model_mb"] = status_mb("VmRSS")
    batches = _phase_rows(cfg)(module.tokenizer)
    measured = cfg.warmup
    profiled = measured + 1 if tensors else None
    meter = PhaseMeter()
    wrap_phase(module, "policy_logps", meter, "policy forward", "loss")
    wrap_phase(module, "reference_logps", meter, "reference forward", None)  # then the policy forward

    class Probe(L.Callback):
        prof = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == measured:
                out["step_start"] = {"rss_mb": status_mb("VmRSS"), **malloc_totals_mb()}
                meter.start("step start")
            elif batch_idx == profiled:
                self.prof = profiled_step_start()
                meter.start("step start", ranges=True)

        def on_before_backward(self, trainer, pl_module, loss):
            meter.mark("backward")

        def on_after_backward(self, trainer, pl_module):
            meter.mark("after backward")

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            meter.mark("optimizer step")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == measured:
                out["phases"] = meter.stop()
            elif batch_idx == profiled:
                meter.stop()
                self.prof.stop()
                out["tensors"] = tensor_phases(self.prof)

    trainer = L.Trainer(accelerator="cpu", devices=1, precision="32-true", max_steps=len(batches), logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Probe()], log_every_n_steps=cfg.log_every)
    trainer.fit(module, train_dataloaders=DataLoader(batches, batch_size=None, shuffle=False, collate_fn=lambda b: b))
    return out


def phases_trl_lora(cfg, spec: dict[str, Any], tensors: bool) -> dict[str, Any]:
    """TRL's `DPOTrainer` of `bench_dpo.trl` with `peft_config` (no reference model built)."""
    import torch
    from transformers import TrainerCallback
    from trl import DPOTrainer

    from benchmarks import bench_dpo
    from lit_rlhf import models

    out: dict[str, Any] = {"rss_runtime_mb": status_mb("VmRSS")}
    config = peft_config(spec)
    models.frozen_copy = lambda model: None  # with peft_config TRL's reference is the base: build no copy
    measured = cfg.warmup
    profiled = measured + 1 if tensors else None
    meter = PhaseMeter()
    original = DPOTrainer.__init__

    @functools.wraps(original)
    def with_peft(self, *args, **kwargs):
        kwargs["ref_model"] = None
        original(self, *args, peft_config=config, **kwargs)
        out["rss_model_mb"] = status_mb("VmRSS")
        wrap_phase(self.model, "forward", meter, lambda: "policy forward" if torch.is_grad_enabled() else "reference forward",
                   "loss")
        wrap_phase(self.accelerator, "backward", meter, "backward", "after backward")

    DPOTrainer.__init__ = with_peft

    class Probe(TrainerCallback):
        prof = None
        times: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == measured:
                out["step_start"] = {"rss_mb": status_mb("VmRSS"), **malloc_totals_mb()}
                meter.start("step start")
            elif state.global_step == profiled:
                self.prof = profiled_step_start()
                meter.start("step start", ranges=True)

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            meter.mark("optimizer step")

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step - 1 == measured:
                out["phases"] = meter.stop()
            elif state.global_step - 1 == profiled:
                meter.stop()
                self.prof.stop()
                out["tensors"] = tensor_phases(self.prof)

    bench_dpo.trl_step_timer = Probe
    bench_dpo.trl(cfg)
    return out


def phases_bare(cfg, spec: dict[str, Any], tensors: bool) -> dict[str, Any]:
    """The floor: the LoRA policy (same adapters), the same batches and log-prob path
    (`grouped_token_logps`: shared prompt, chunked output layer) and fused AdamW in plain torch:
    reference forward without grad (adapter off), policy forward, DPO sigmoid loss, backward, step
    (the module's order)."""
    import torch
    import torch.nn.functional as F

    from benchmarks import bench_dpo
    from lit_rlhf.models import adapters, load_causal_lm, load_tokenizer
    from lit_rlhf.ops import DEFAULT_CHUNK_SIZE
    from lit_rlhf.models.shared_prompt import grouped_token_logps

    out: dict[str, Any] = {"rss_runtime_mb": status_mb("VmRSS")}
    tokenizer = load_tokenizer(cfg.model)
    policy = adapters.add_lora(load_causal_lm(cfg.model, tokenizer, "float32"), peft_config(spec), adapters.POLICY)
    adapters.set_trainable(policy, {adapters.POLICY: True})
    policy.train()
    if cfg.gradient_checkpointing:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={
            "use_reentrant": False, "context_fn": adapters.checkpoint_context_fn(policy)})
        policy.enable_input_require_grads()
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=bench_dpo.LR, fused=True)
    out["rss_model_mb"] = status_mb("VmRSS")
    meter = PhaseMeter()
    prof = None
    for step, batch in enumerate(_phase_rows(cfg)(tokenizer)):
        if step == cfg.warmup:
            out["step_start"] = {"rss_mb": status_mb("VmRSS"), **malloc_totals_mb()}
            meter.start("step start")
        elif tensors and step == cfg.warmup + 1:
            prof = profiled_step_start()
            meter.start("step start", ranges=True)
        elif step > cfg.warmup + int(tensors):
            break
        args = (batch.input_ids, batch.attention_mask, batch.loss_mask, batch.sharing, 1.0, DEFAULT_CHUNK_SIZE)
        meter.mark("reference forward")
        with torch.no_grad(), adapters.use_adapter(policy, None):
            ref = (grouped_token_logps(policy, *args) * batch.loss_mask).sum(dim=1)  # (2B,)
        meter.mark("policy forward")
        logps = (grouped_token_logps(policy, *args) * batch.loss_mask).sum(dim=1)  # (2B,)
        meter.mark("loss")
        half = logps.shape[0] // 2
        h = (logps[:half] - ref[:half]) - (logps[half:] - ref[half:])  # (B,)
        loss = -F.logsigmoid(bench_dpo.BETA * h).mean()
        meter.mark("backward")
        loss.backward()
        meter.mark("optimizer step")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        phases = meter.stop()
        if prof is not None:
            prof.stop()
            out["tensors"] = tensor_phases(prof)
        elif step == cfg.warmup:
            out["phases"] = phases
    return out


def phases_worker(variant: str, argv: Sequence[str], spec: dict[str, Any], tensors: bool) -> dict[str, Any]:
    from benchmarks import bench_dpo

    cfg, _ = parse_config(argv, "dpo phases worker", getattr(bench_dpo, "_extra", None))
    setup_worker(cfg)
    if tensors:
        cfg.steps += 1  # the profiled step runs after the measured one
    run = {"lora": phases_lora, "trl_lora": phases_trl_lora, "bare": phases_bare}[variant]
    out = run(cfg, spec, tensors)
    out["step_peak_mb"] = max(p["peak_mb"] for p in out["phases"])
    out["runtime_modules"] = sorted(m for m in ("lightning", "transformers", "peft", "trl", "datasets", "accelerate")
                                    if m in sys.modules)
    return out


def run_phases(variants: Sequence[str], passthrough: list[str], ns) -> dict[str, Any]:
    """Each variant in its own process, one after the other (with `--json`, the results so far
    are written after each)."""
    results = {}
    for variant in variants:
        print(f"[lora phases] {variant} ...", file=sys.stderr, flush=True)
        python = ns.trl_python if variant == "trl_lora" else sys.executable
        with tempfile.TemporaryDirectory(prefix="lit_rlhf_bench_lora_phases_") as tmp:
            result = Path(tmp) / "phases.json"
            cmd = [python, "-m", "benchmarks.bench_lora_phases", "--lora-r", str(ns.lora_r), "--lora-alpha", str(ns.lora_alpha),
                   "--phase-worker", variant, "--worker-result", str(result), *(["--tensors"] if ns.tensors else []),
                   "--", *passthrough]
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            if proc.returncode != 0 or not result.exists():
                raise RuntimeError(f"phases/{variant} worker failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
            results[variant] = json.loads(result.read_text())
        write_json(ns.json, {"phases": results, "partial": True})
    return results


def format_phases(results: dict[str, Any]) -> str:
    lines = []
    for variant, r in results.items():
        start = r["step_start"]
        lines.append(f"{variant}: runtime {r['rss_runtime_mb']:.0f} MiB, + model {r['rss_model_mb']:.0f}, step start "
                     f"{start['rss_mb']:.0f} (malloc holds {start['malloc_free_held_mb']:.0f} freed), step peak "
                     f"{r['step_peak_mb']:.0f}")
        for p in r["phases"]:
            lines.append(f"    {p['phase']:>18}: start {p['rss_start_mb']:7.0f}  peak {p['peak_mb']:7.0f}  "
                         f"(+{p['peak_mb'] - start['rss_mb']:6.0f} over step start)")
        for p in (r.get("tensors") or {}).get("phases", []):
            cats = ", ".join(f"{k} {v:.0f}" for k, v in p.items() if k not in ("phase", "total_mb") and v >= 0.5)
            lines.append(f"    tensors at {p['phase']:>18} peak: {p['total_mb']:7.0f} MiB ({cats})")
    if "lora" in results and "trl_lora" in results:
        lines.append(f"lora / trl_lora step peak: {results['lora']['step_peak_mb'] / results['trl_lora']['step_peak_mb']:.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = lora_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--phase-variants", default=",".join(PHASE_VARIANTS))
    parser.add_argument("--tensors", action="store_true", help="torch's memory profiler on one more step")
    parser.add_argument("--phase-worker", help=argparse.SUPPRESS)
    ns, passthrough = parse_lora_args(parser, argv)  # the DPO benchmark's flags pass through
    spec = lora_spec(ns)
    if ns.phase_worker:
        result = phases_worker(ns.phase_worker, passthrough, spec, ns.tensors)
        Path(ns.worker_result).write_text(json.dumps(result))
        return None
    variants = [v for v in ns.phase_variants.split(",") if v]
    unknown = [v for v in variants if v not in PHASE_VARIANTS]
    if unknown:
        raise SystemExit(f"unknown phase variant(s) {unknown}; expected some of {list(PHASE_VARIANTS)}")
    out = {"phases": run_phases(variants, passthrough, ns),
           "config": {"argv": argv, "lora": spec, "load_average": os.getloadavg()}}
    print(format_phases(out["phases"]))
    write_json(ns.json, out)
    return out


if __name__ == "__main__":
    main()
