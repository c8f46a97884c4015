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

`--samplers`: our sampling loop (`lit_rlhf.generation.sample_tokens`: preallocated cache,
finished rows compacted out) against the loop it replaced (`benchmarks/previous_sampler.py`)
and transformers' `generate`, on the same chat prompts (the bundled arithmetic questions, so
rows end on EOS at different lengths), same seed per round, rounds interleaved in a rotating
order; also checks that the three draw the same tokens. `--write` renders its table into
benchmarks/RESULTS.md; `--render FILE --write` re-renders a result file:

    python -m benchmarks.bench_generation --samplers --model smollm2-135m-instruct --threads 2 --rounds 3 \
        --warmup 1 --new-tokens 128 --json benchmarks/results/samplers_smollm2.json --write

(128 new tokens: SmolLM2's answers to these questions end between ~10 and ~150 tokens, so rows
finish at different steps as in a GRPO rollout.)
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

SAMPLERS = ("ours", "previous", "generate")
BEGIN, END = "<!-- sampler-benchmark:begin -->", "<!-- sampler-benchmark:end -->"
TITLE = "Our sampler: preallocated cache and finished rows compacted (`bench_generation.py --samplers`)"


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    """The first `n` bundled arithmetic questions as generation prompts (the chat template when the
    tokenizer has one), ids without padding."""
    from lit_rlhf.data.formatting import chat_prompt, encode_prompt

    lines = (Path(__file__).resolve().parents[1] / "lit_rlhf/data/bundled/arithmetic.test.jsonl").read_text().splitlines()
    questions = [json.loads(line)["question"] for line in lines[:n]]
    chat = bool(getattr(tokenizer, "chat_template", None))
    return [encode_prompt(tokenizer, chat_prompt(tokenizer, [{"role": "user", "content": q}]) if chat else q, chat=chat)
            for q in questions]


def run_samplers(args: argparse.Namespace) -> dict:
    """Time `SAMPLERS` on the GRPO- and PPO-shaped workloads; the result dict (and --json, --write)."""
    from benchmarks.report import write_block

    if args.render:
        result = json.loads(Path(args.render).read_text())
    else:
        result = measure_samplers(args)
    text = render_samplers(result)
    if args.write:
        write_block(text, BEGIN, END, TITLE, after="## Generation backends")
    print(text)
    return result


def measure_samplers(args: argparse.Namespace) -> dict:
    import os

    import torch

    from benchmarks.common import machine_info
    from benchmarks.previous_sampler import previous_sample_tokens
    from lit_rlhf.data.collate import pad_left
    from lit_rlhf.generation import SamplingConfig, finish_responses, sample_tokens
    from lit_rlhf.models import load_causal_lm, load_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model, padding_side="left")
    policy = load_causal_lm(args.model, tokenizer, dtype="float32").eval()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = SamplingConfig(max_new_tokens=args.new_tokens, temperature=args.temperature)

    def sample(name: str, ids, mask):
        if name == "ours":
            return sample_tokens(policy, ids, mask, config, eos, pad)
        if name == "previous":
            return previous_sample_tokens(policy, ids, mask, config, eos, pad)
        out = policy.generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=config.max_new_tokens,
                              do_sample=True, temperature=config.temperature, top_k=None, top_p=1.0, eos_token_id=eos,
                              pad_token_id=pad, use_cache=True, repetition_penalty=None)
        return out[:, ids.shape[1]:]

    prompts = chat_prompts(tokenizer, max(args.grpo_prompts, args.ppo_prompts))
    workloads = {"grpo": (prompts[:args.grpo_prompts], args.generations), "ppo": (prompts[:args.ppo_prompts], 1)}
    result: dict = {"args": {k: v for k, v in vars(args).items() if k not in ("write", "render")},
                    "machine": machine_info(torch.get_num_threads()), "load_average_before": os.getloadavg(),
                    "workloads": {}}
    for workload, (rows, repeats) in workloads.items():
        ids, mask = pad_left(rows, pad)
        ids, mask = ids.repeat_interleave(repeats, 0), mask.bool().repeat_interleave(repeats, 0)
        times: dict[str, list[float]] = {name: [] for name in SAMPLERS}
        same = {name: True for name in SAMPLERS[1:]}
        for r in range(args.warmup + args.rounds):
            kept = {}
            for name in SAMPLERS[r % 3:] + SAMPLERS[:r % 3]:  # a rotating order: drift hits all alike
                torch.manual_seed(r)
                start = time.perf_counter()
                tokens = sample(name, ids, mask)
                seconds = time.perf_counter() - start
                kept[name] = finish_responses(tokens, config.max_new_tokens, eos, pad)
                if r >= args.warmup:
                    times[name].append(seconds)
            for name in same:
                same[name] &= all(bool(torch.equal(a, b)) for a, b in zip(kept["ours"], kept[name]))
        lengths = kept["ours"][1].sum(dim=1).float()
        result["workloads"][workload] = {
            "rows": ids.shape[0], "prompt_tokens": [int(mask.sum(dim=1).min()), ids.shape[1]],
            "mean_length": float(lengths.mean()), "ended_on_eos": float(kept["ours"][2].float().mean()),
            "seconds": {name: {"median": statistics.median(t), "min": min(t), "max": max(t), "n": len(t)}
                        for name, t in times.items()},
            "same_tokens_as_ours": same,
        }
    result["load_average_after"] = os.getloadavg()
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        result["file"] = str(path)
        path.write_text(json.dumps(result, indent=2))
    return result


def render_samplers(result: dict) -> str:
    """The table: seconds per rollout (median, min-max) per sampler, our speed-up, same tokens."""
    a, m = result["args"], result["machine"]
    load = f"{result['load_average_before'][0]:.1f}/{result['load_average_after'][0]:.1f}"
    lines = [(f"Measured {m['date'][:16].replace('T', ' ')} on {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch "
             f"threads; torch {m['torch']}, transformers {m['transformers']}; load average before/after {load}), "
             f"{a['model']} fp32, up to {a['new_tokens']} new tokens at temperature {a['temperature']}, median of "
             f"{a['rounds']} rounds after {a['warmup']} warm-up. Raw file: `{result.get('file', '-')}`."), "",
             ("| workload | rows | mean length (ended on EOS) | ours s | previous loop s | transformers generate s "
             "| **speed-up vs previous** | speed-up vs generate | same tokens (previous, generate) |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for workload, w in result["workloads"].items():
        s = {k: v for k, v in w["seconds"].items()}
        cells = [f"{v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})" for v in s.values()]
        ours = s["ours"]["median"]
        same = ", ".join("yes" if w["same_tokens_as_ours"][k] else "NO" for k in ("previous", "generate"))
        lines.append(f"| {workload} | {w['rows']} | {w['mean_length']:.1f} ({w['ended_on_eos']:.0%}) | " + " | ".join(cells)
                     + f" | **{s['previous']['median'] / ours:.2f}x** | {s['generate']['median'] / ours:.2f}x | {same} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict | None:
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
    parser.add_argument("--samplers", action="store_true", help="ours vs the previous loop vs transformers' generate")
    parser.add_argument("--temperature", type=float, default=1.0, help="--samplers only")
    parser.add_argument("--write", action="store_true", help="--samplers: render into benchmarks/RESULTS.md")
    parser.add_argument("--render", default=None, help="--samplers: render this result file without measuring")
    args = parser.parse_args(argv)
    if args.samplers or args.render:
        return run_samplers(args)

    import torch

    from lit_rlhf.data.collate import pad_left
    from lit_rlhf.generation import (
        SamplingConfig,
        generate_responses,
        token_logps_with_grad,
    )
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
