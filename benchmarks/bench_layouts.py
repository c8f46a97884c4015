"""Step time and memory of the padded and the shared-prompt layouts (`lit_rlhf.ops.shared_prompt`).

One process, one model per method; each measured step runs the SAME batch on both layouts
(`shared_prompt` toggled on the module), in alternating order (padded, shared, shared, padded,
...), so both see the same machine load. Reported per method: the median step time of each
layout and their ratio (padded / shared), the tokens each layout runs through the model, and the
peak memory of a step (CPU: the kernel's resident high-water mark reset right before the step,
`benchmarks.common.StepPeaks`; CUDA: `torch.cuda.max_memory_allocated` reset likewise).

Steps, at TL;DR shapes (prompts of `--prompt-min`..`--prompt-max` tokens, completions of
`--completion-min`..`--completion-max` tokens, one row per batch `--long-completion` long):

- `dpo`: `DPOModule.compute_loss` (policy fwd on the pairs + live reference fwd), backward, AdamW;
- `reward`: `RewardModule` Bradley-Terry loss on the pairs, backward, AdamW;
- `grpo`: the GRPO update of one rollout with G = `--generations` completions per prompt
  (generation excluded: it does not depend on the layout): reference log-probs and reward-model
  scores without grad, then policy log-probs fwd+bwd, the clipped loss with the k3 KL, AdamW.

Check that it runs (tiny model): `python benchmarks/bench_layouts.py --steps 2 --warmup 1`.
Timing on a quiet machine: see benchmarks/README.md ("Shared prompts").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.common import StepPeaks  # noqa: E402
from lit_rlhf.losses import grpo_policy_loss  # noqa: E402
from lit_rlhf.models import ScalarHeadModel, backbone_of  # noqa: E402
from lit_rlhf.modules import DPOModule, GRPOModule, RewardModule  # noqa: E402
from lit_rlhf.ops import shared_prompt as sp  # noqa: E402
from lit_rlhf.rewards.sources import reward_model_scores  # noqa: E402
from lit_rlhf.types import PreferenceBatch, PromptSharing  # noqa: E402
from lit_rlhf.data.collate import PreferenceCollator, pad_left  # noqa: E402

LAYOUTS = ("padded", "shared")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-random-smollm2", help="e.g. smollm2-135m-instruct on a quiet machine")
    p.add_argument("--methods", default="dpo,reward,grpo")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="float32", choices=["float32", "bf16-mixed"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pairs", type=int, default=8, help="DPO / reward pairs per step")
    p.add_argument("--prompts", type=int, default=4, help="GRPO prompts per rollout")
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--prompt-min", type=int, default=400)
    p.add_argument("--prompt-max", type=int, default=512)
    p.add_argument("--completion-min", type=int, default=30)
    p.add_argument("--completion-max", type=int, default=53)
    p.add_argument("--long-completion", type=int, default=169, help="one row per batch this long; 0: none")
    p.add_argument("--steps", type=int, default=10, help="measured steps (each runs both layouts)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layouts", default="padded,shared",
                   help="one layout per process for memory (a process's freed memory stays resident)")
    p.add_argument("--out", default="", help="write the JSON result here too")
    return p.parse_args(argv)


def lengths(gen: torch.Generator, n: int, low: int, high: int) -> list[int]:
    return torch.randint(low, high + 1, (n,), generator=gen).tolist()


def random_ids(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(10, vocab - 10, (n,), generator=gen).tolist()


def pair_batches(args, vocab: int, eos: int, pad: int, count: int) -> list[PreferenceBatch]:
    gen = torch.Generator().manual_seed(args.seed)
    batches = []
    for _ in range(count):
        prompts = lengths(gen, args.pairs, args.prompt_min, args.prompt_max)
        chosen = lengths(gen, args.pairs, args.completion_min, args.completion_max)
        rejected = lengths(gen, args.pairs, args.completion_min, args.completion_max)
        if args.long_completion:
            chosen[0] = args.long_completion
        rows = [{"_prompt_ids": random_ids(gen, p, vocab), "_chosen_ids": random_ids(gen, c - 1, vocab) + [eos],
                 "_rejected_ids": random_ids(gen, r - 1, vocab) + [eos]} for p, c, r in zip(prompts, chosen, rejected)]
        batches.append(PreferenceCollator(pad)(rows))
    return batches


def rollouts(args, vocab: int, eos: int, pad: int, count: int) -> list[dict[str, torch.Tensor]]:
    """Left-padded prompts repeated G times, responses cut after their EOS and PAD-filled (D23)."""
    gen = torch.Generator().manual_seed(args.seed + 1)
    out = []
    g = args.generations
    width = max(args.completion_max, args.long_completion)
    for _ in range(count):
        prompts = [random_ids(gen, n, vocab) for n in lengths(gen, args.prompts, args.prompt_min, args.prompt_max)]
        prompt_ids, prompt_mask = pad_left(prompts, pad)
        prompt_ids, prompt_mask = prompt_ids.repeat_interleave(g, 0), prompt_mask.repeat_interleave(g, 0)
        n = prompt_ids.shape[0]
        sizes = lengths(gen, n, args.completion_min, args.completion_max)
        if args.long_completion:
            sizes[0] = args.long_completion
        response_ids = torch.full((n, width), pad, dtype=torch.long)
        for i, size in enumerate(sizes):
            response_ids[i, :size] = torch.tensor(random_ids(gen, size - 1, vocab) + [eos])
        response_mask = response_ids != pad
        advantages = torch.randn(n, generator=gen)
        out.append(dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                        response_mask=response_mask, advantages=advantages))
    return out


def token_counts(input_ids: torch.Tensor, attention_mask: torch.Tensor, sharing: PromptSharing) -> dict[str, int]:
    layout = sp.build_layout(input_ids, attention_mask, sharing)
    return {"padded_tokens": int(input_ids.numel()), "shared_tokens": int(layout.input_ids.numel()),
            "real_tokens": int(attention_mask.sum())}


class Method:
    """One training step of a method on either layout."""

    def __init__(self, name: str, args, device: torch.device):
        self.name, self.args, self.device = name, args, device
        if name == "dpo":
            self.module = DPOModule(model=args.model, beta=0.1)
            self.params = list(self.module.policy.parameters())
        elif name == "reward":
            self.module = RewardModule(model=args.model)
            self.params = list(self.module.reward_model.parameters())
        else:
            self.module = GRPOModule(model=args.model, num_generations=args.generations, kl_coef=0.04,
                                     reward_fns=[len])
            torch.manual_seed(args.seed)
            self.reward_model = ScalarHeadModel(backbone_of(self.module.ref_model)).eval().requires_grad_(False)
            self.params = list(self.module.policy.parameters())
        self.module.to(device)
        if name == "grpo":
            self.reward_model.to(device)
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-6)
        tok = self.module.tokenizer
        vocab = self.module.policy.config.vocab_size if name != "reward" else self.module.reward_model.config.vocab_size
        count = args.warmup + args.steps
        if name == "grpo":
            self.batches = rollouts(args, min(vocab, len(tok)), tok.eos_token_id, tok.pad_token_id, count)
        else:
            self.batches = pair_batches(args, min(vocab, len(tok)), tok.eos_token_id, tok.pad_token_id, count)

    def set_layout(self, layout: str) -> None:
        self.module.shared_prompt = layout == "shared"

    def counts(self, batch) -> dict[str, int]:
        if self.name == "grpo":
            ids = torch.cat([batch["prompt_ids"], batch["response_ids"]], 1)
            mask = torch.cat([batch["prompt_mask"], batch["response_mask"]], 1)
            n = ids.shape[0]
            ends = torch.full((n,), batch["prompt_ids"].shape[1], dtype=torch.long)
            return token_counts(ids, mask, PromptSharing(ends, torch.arange(n) // self.args.generations))
        return token_counts(batch.input_ids, batch.attention_mask, batch.sharing)

    def step(self, batch) -> None:
        m = self.module
        if self.name == "dpo":
            loss, _ = m.compute_loss(batch)
        elif self.name == "reward":
            loss = m._loss(batch)[0].loss
        else:
            b = batch
            g = self.args.generations
            groups = torch.arange(b["prompt_ids"].shape[0], device=self.device) // g
            args = (b["prompt_ids"], b["prompt_mask"], b["response_ids"], b["response_mask"])
            with torch.no_grad():
                ref = m.response_token_logps(m.ref_model, *args, 1.0, None, groups)
                ids, mask = m_cat(b)
                reward_model_scores(self.reward_model, ids, mask, None, groups if m.shared_prompt else None,
                                    b["prompt_ids"].shape[1])
            logps = m.response_token_logps(m.policy, *args, 1.0, None, groups)
            loss = grpo_policy_loss(logps, None, ref, b["advantages"], b["response_mask"], 0.2, 0.2, 0.04, "token_mean",
                                    max_completion_length=b["response_ids"].shape[1]).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def m_cat(b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([b["prompt_ids"], b["response_ids"]], 1), torch.cat([b["prompt_mask"], b["response_mask"]], 1)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_method(name: str, args, device: torch.device) -> dict:
    method = Method(name, args, device)
    layouts = tuple(args.layouts.split(","))
    times = {layout: [] for layout in layouts}
    peaks = {layout: [] for layout in layouts}
    counts = [method.counts(b) for b in method.batches]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed")
    for i, batch in enumerate(method.batches):
        batch = batch.to(device) if hasattr(batch, "to") and not isinstance(batch, dict) else (
            {k: v.to(device) for k, v in batch.items()})
        order = layouts if i % 2 == 0 else layouts[::-1]  # ABBA: neither layout always runs first
        for layout in order:
            method.set_layout(layout)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            StepPeaks.peaks.clear()
            StepPeaks.start()
            sync(device)
            started = time.perf_counter()
            with autocast:
                method.step(batch)
            sync(device)
            elapsed = time.perf_counter() - started
            StepPeaks.stop()
            if i >= args.warmup:
                times[layout].append(elapsed)
                peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else (
                    StepPeaks.peaks[-1] if StepPeaks.peaks else float("nan"))
                peaks[layout].append(peak)
    medians = {layout: statistics.median(times[layout]) for layout in layouts}
    both = set(layouts) == set(LAYOUTS)
    return {
        "method": name,
        "median_step_s": medians,
        "speedup_padded_over_shared": medians["padded"] / medians["shared"] if both else None,
        "speedup_per_step": [p / s for p, s in zip(times["padded"], times["shared"])] if both else None,
        "step_peak_mb": {layout: max(peaks[layout]) for layout in layouts},
        "peak_kind": "cuda max_memory_allocated" if device.type == "cuda" else "step VmHWM (resident)",
        "tokens_per_step": {k: statistics.mean(c[k] for c in counts) for k in counts[0]},
    }


def main(argv=None) -> dict:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    result = {"config": vars(args), "methods": []}
    for name in args.methods.split(","):
        out = run_method(name, args, device)
        result["methods"].append(out)
        t = out["tokens_per_step"]
        steps = "  ".join(f"{k} {v:.3f}s" for k, v in out["median_step_s"].items())
        speedup = "" if out["speedup_padded_over_shared"] is None else f"  speed-up x{out['speedup_padded_over_shared']:.2f}"
        peaks = "  ".join(f"{k} {v:.0f}" for k, v in out["step_peak_mb"].items())
        print(f"{name:7s} {steps}{speedup}  tokens padded {t['padded_tokens']:.0f} shared {t['shared_tokens']:.0f} "
              f"(real {t['real_tokens']:.0f})  step peak MB {peaks}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
