"""Rollout and whole-step time, our `HFSampler` vs the colocated `VLLMSampler`, side by side (interleaved).

    python -m benchmarks.bench_generation --model smollm2-135m-instruct --rounds 5 --json benchmarks/results/generation.json

Both backends sample the same prompts with the same settings (temperature 1, exactly
`--new-tokens` new tokens at most, EOS stops a row), rounds interleaved hf, vllm, hf, vllm ... so
machine noise hits both alike; medians are reported. Workloads:

- `grpo`: `--grpo-prompts` prompts x G = `--generations` samples (default 2 x 8, 64 new tokens);
- `ppo`: `--ppo-prompts` prompts x 1 sample (default 16, 64 new tokens).

One step = the rollout + the trainer's update on it: policy log-probs of the B*G rows with
grad (the trainer always recomputes them), a policy-gradient loss, backward, AdamW; with vllm
also the weight sync that loads the updated weights into the engine before the next rollout
(timed separately too). PPO's value model and the reward are the same work for both backends
and left out. The engine is built once, before the timed rounds (model load is reported).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per backend and workload")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--grpo-prompts", type=int, default=2)
    parser.add_argument("--ppo-prompts", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import torch

    from lit_rlhf.data.collate import pad_left
    from lit_rlhf.generation import SamplingConfig, generate_responses, token_logps_with_grad
    from lit_rlhf.generation.vllm import VLLMEngine
    from lit_rlhf.models import load_causal_lm, load_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokenizer = load_tokenizer(args.model, padding_side="left")
    policy = load_causal_lm(args.model, tokenizer, dtype="float32")
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-7)
    started = time.perf_counter()
    engine = VLLMEngine.from_policy(policy, tokenizer, max_model_len=args.prompt_tokens + args.new_tokens + 16)
    load_s = time.perf_counter() - started
    vocab = [t for t in range(len(tokenizer)) if t not in (tokenizer.eos_token_id, tokenizer.pad_token_id)]
    sampling = SamplingConfig(max_new_tokens=args.new_tokens, temperature=1.0)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    def prompts(n: int, repeats: int):
        g = torch.Generator().manual_seed(n)
        rows = [[vocab[i] for i in torch.randint(len(vocab), (args.prompt_tokens - (j % 8),), generator=g).tolist()]
                for j in range(n)]
        ids, mask = pad_left(rows, pad)
        return ids.repeat_interleave(repeats, 0), mask.bool().repeat_interleave(repeats, 0)

    def step(backend: str, ids, mask) -> dict[str, float]:
        t0 = time.perf_counter()
        if backend == "hf":
            out_ids, out_mask, _ = generate_responses(policy, ids, mask, sampling, eos, pad)
        else:
            out_ids, out_mask, _, _ = engine.generate(ids, mask, sampling, eos, pad)
        t1 = time.perf_counter()
        logps = token_logps_with_grad(policy, ids, mask, out_ids, out_mask, 1.0, micro_batch_size=8)
        loss = -(logps * out_mask).sum() / out_mask.sum().clamp(min=1)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if backend == "vllm":
            engine.sync_weights(policy)
        t3 = time.perf_counter()
        return {"rollout_s": t1 - t0, "update_s": t2 - t1, "sync_s": t3 - t2, "step_s": t3 - t0,
                "tokens": float(out_mask.sum())}

    workloads = {"grpo": prompts(args.grpo_prompts, args.generations), "ppo": prompts(args.ppo_prompts, 1)}
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name, (ids, mask) in workloads.items():
        runs: dict[str, list[dict[str, float]]] = {"hf": [], "vllm": []}
        for r in range(args.warmup + args.rounds):
            for backend in ("hf", "vllm"):  # interleaved
                out = step(backend, ids, mask)
                if r >= args.warmup:
                    runs[backend].append(out)
        results[name] = {b: {k: statistics.median(x[k] for x in v) for k in v[0]} for b, v in runs.items()}
        hf, vl = results[name]["hf"], results[name]["vllm"]
        print(f"{name}: {ids.shape[0]} rows x {args.new_tokens} new tokens, median of {args.rounds} | "
              f"rollout hf {hf['rollout_s']:.2f} s, vllm {vl['rollout_s']:.2f} s ({hf['rollout_s'] / vl['rollout_s']:.2f}x) | "
              f"step hf {hf['step_s']:.2f} s, vllm {vl['step_s']:.2f} s ({hf['step_s'] / vl['step_s']:.2f}x; "
              f"sync {vl['sync_s']:.2f} s)")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"engine build {load_s:.1f} s; peak RSS {peak_mb:.0f} MB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "engine_build_s": load_s, "peak_rss_mb": peak_mb, "results": results}, f, indent=2)


if __name__ == "__main__":  # vLLM may start worker processes with spawn
    main()
