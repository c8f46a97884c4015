"""SFT step time, packed (padding-free) vs padded, on the bundled TL;DR SFT data.

    python -m benchmarks.bench_packing --json benchmarks/results/packing_smollm2.json

One `SFTModule` (float32, `torch.set_num_threads(--threads)`), the bundled TL;DR SFT train split
formatted as the quickstart does (`TLDRSFTDataModule`, prompts up to `--max-prompt-length`,
completions up to `--max-completion-length`), cut into consecutive batches of `--batch-size`
examples. Each batch is collated twice, right padded (`SFTCollator`) and packed
(`PackedSFTCollator`, rows of at most `--pack-length` tokens; default one row per batch), and a
training step (loss, backward, AdamW step, zero grad) runs on each, interleaved A/B with the
order alternating (padded first on even batches, packed first on odd ones) over `--rounds`
passes; the first `--warmup` pairs are not timed. Both arms train the same module, so they see
the same weights give or take one step.

Reported per arm: the median, min and max step time, tokens per second (real tokens), and the
token counts: real tokens, token slots (rows x width), padding fraction, and the attention
slots (sum over rows of width^2, what an sdpa/eager kernel computes with a dense mask) and the
example attention slots (sum over packed examples of length^2, what `sdpa_varlen` computes;
`--attention masked` times the packed rows under sdpa's block mask instead). The
speedup is the median padded step over the median packed step, and the median of the per-pair
ratios. The first batch's loss is checked equal on both layouts (`loss_abs_diff`).
`--counts-only`: the token counts alone (no step runs; meaningful on a busy machine).
`--comparisons`: `--data` is TL;DR comparisons data (e.g. the shared `tldr/comparisons.sample.jsonl`,
real post lengths), each prompt with its chosen summary an SFT example (rows that fail the
formatting are skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from lit_rlhf.training.memory import Memory
from lit_rlhf.models.attention import boundaries_from_positions


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--data", default="bundled:tldr_sft")
    p.add_argument("--max-prompt-length", type=int, default=256)
    p.add_argument("--max-completion-length", type=int, default=53)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--pack-length", type=int, default=None, help="tokens per packed row (default: one row per batch)")
    p.add_argument("--limit", type=int, default=None, help="examples of the train split (default: all)")
    p.add_argument("--rounds", type=int, default=1, help="passes over the batches")
    p.add_argument("--warmup", type=int, default=2, help="untimed A/B pairs at the start")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chunk-size", type=int, default=256, help="logprob_chunk_size (0: dense logits)")
    p.add_argument("--comparisons", action="store_true",
                   help="--data is TL;DR comparisons data: each prompt + its chosen summary is an SFT example")
    p.add_argument("--counts-only", action="store_true", help="token counts only, no training steps")
    p.add_argument("--attention", choices=("varlen", "masked"), default="varlen",
                   help="packed rows: varlen = what SFTModule runs (sdpa_varlen, each example's attention alone); "
                        "masked = sdpa with the block-diagonal mask over the whole row")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _counts(batches: Sequence[Any]) -> dict[str, float]:
    tokens = sum(int(b.attention_mask.sum()) for b in batches)
    slots = sum(b.attention_mask.numel() for b in batches)
    attention = sum(b.input_ids.shape[0] * b.input_ids.shape[1] ** 2 for b in batches)
    position_ids = [b.position_ids for b in batches if getattr(b, "position_ids", None) is not None]
    examples = [int(n) ** 2 for p in position_ids for n in boundaries_from_positions(p)["cu_seq_lens_q"].diff()]
    return {"batches": len(batches), "rows": sum(b.input_ids.shape[0] for b in batches), "tokens": tokens,
            "slots": slots, "padding_fraction": 1 - tokens / slots if slots else 0.0, "attention_slots": attention,
            "example_attention_slots": sum(examples) if position_ids else attention}


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from lit_rlhf.data import TLDRPreferenceDataModule, TLDRSFTDataModule
    from lit_rlhf.data.collate import SFTCollator
    from lit_rlhf.data.packing import PackedSFTCollator
    from lit_rlhf.modules import SFTModule
    from lit_rlhf.training.optim import build_adamw

    if args.attention == "masked":  # keep sdpa: SFTModule would switch the policy to sdpa_varlen
        import lit_rlhf.modules.sft as sft

        sft.use_varlen_attention = lambda model: False
    module = SFTModule(model=args.model, memory=Memory(logprob_chunk_size=args.chunk_size or None))
    module.train()
    common = dict(tokenizer=module.tokenizer, max_prompt_length=args.max_prompt_length,
                  max_completion_length=args.max_completion_length, batch_size=args.batch_size, val_split=None,
                  limit=args.limit)
    if args.comparisons:
        dm = TLDRPreferenceDataModule(args.data, on_bad_rows="skip", **common)
        rows = [{"_prompt_ids": r["_prompt_ids"], "_completion_ids": r["_chosen_ids"]}
                for r in dm.dataset("train").to_list()]
    else:
        rows = TLDRSFTDataModule(args.data, test_split=None, **common).dataset("train").to_list()
    pad = module.tokenizer.pad_token_id
    groups = [rows[i: i + args.batch_size] for i in range(0, len(rows), args.batch_size)]
    collators = {"padded": SFTCollator(pad), "packed": PackedSFTCollator(pad, args.pack_length)}
    batches = {name: [c(g) for g in groups] for name, c in collators.items()}
    if args.counts_only:
        result = {name: _counts(b) for name, b in batches.items()}
        result["slot_ratio"] = result["padded"]["slots"] / result["packed"]["slots"]
        print(json.dumps(result))
        return result
    optimizer = build_adamw([{"params": [p for p in module.parameters() if p.requires_grad]}], lr=1e-6, eps=1e-8,
                            betas=(0.9, 0.999), weight_decay=0.0)

    with torch.no_grad():
        losses = {name: float(module.compute_loss(b[0])[0]) for name, b in batches.items()}

    def step(batch) -> float:
        start = time.perf_counter()
        nll_sum, tokens = module.nll_terms(batch)
        (nll_sum / tokens.clamp(min=1)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"padded": [], "packed": []}
    ratios: list[float] = []
    pair = 0
    for _ in range(args.rounds):
        for i in range(len(groups)):
            order = ("padded", "packed") if pair % 2 == 0 else ("packed", "padded")
            took = {name: step(batches[name][i]) for name in order}
            if pair >= args.warmup:
                for name, t in took.items():
                    times[name].append(t)
                ratios.append(took["padded"] / took["packed"])
            pair += 1
    if not ratios:
        raise ValueError(f"no timed pairs: {pair} pairs, warmup {args.warmup}; raise --rounds or lower --warmup")

    result: dict[str, Any] = {
        "benchmark": "packing", "args": vars(args), "machine": {
            "platform": platform.platform(), "cpus": os.cpu_count(), "threads": args.threads,
            "load_average": os.getloadavg(), "torch": torch.__version__,
            "attention": getattr(module.policy.config, "_attn_implementation", None)},
        "loss_abs_diff": abs(losses["padded"] - losses["packed"]),
    }
    for name in ("padded", "packed"):
        counts = _counts(batches[name])
        per_step_tokens = counts["tokens"] / counts["batches"]
        result[name] = {"step_time_s": _summary(times[name]), **counts,
                        "tokens_per_s": per_step_tokens / statistics.median(times[name])}
    result["speedup_of_medians"] = result["padded"]["step_time_s"]["median"] / result["packed"]["step_time_s"]["median"]
    result["speedup_per_pair"] = _summary(ratios)
    result["slot_ratio"] = result["padded"]["slots"] / result["packed"]["slots"]  # the speedup if time ~ slots
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("loss_abs_diff", "speedup_of_medians", "slot_ratio")}, indent=None))
    for name in ("padded", "packed"):
        r = result[name]
        print(f"{name:7s} median {r['step_time_s']['median'] * 1e3:8.1f} ms  tokens {r['tokens']}  slots {r['slots']}  "
              f"padding {r['padding_fraction']:.3f}  attention slots {r['attention_slots']}")
    return result


if __name__ == "__main__":
    main()
