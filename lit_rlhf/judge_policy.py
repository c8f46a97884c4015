"""Judge a policy's completions against a baseline with a pairwise judge.

The pieces `callbacks.JudgeEvalCallback` uses during training, and a command line to judge a
saved policy outside training:

    python -m lit_rlhf.judge_policy \\
        --policy outputs/tldr/dpo/hf            # an exported HF dir, a .ckpt, or a model name
        --baseline reference                    # the data's reference completions, or a model
        --prompts vwxyzjn/summarize_from_feedback_tldr_3_filtered --split validation \\
        --judge judge.yaml                      # {class_path: lit_rlhf.judges.LocalLMJudge, init_args: {...}}
        --num_prompts 256 --max_new_tokens 53 --output_dir outputs/tldr/dpo/judge
        [--generation_backend vllm --vllm_kwargs '{"max_model_len": 1024}']

`--judge` is a YAML file holding `{class_path, init_args}` (optionally under a `judge:` key), or
a class path with its init args in `--judge_args '{"model_name": "..."}'`. The output directory
gets `metrics.json`, `judgements.jsonl` (one row per prompt) and `win_rate_by_length_ratio.png`;
the metrics are printed as JSON. `--generation_backend vllm` samples the completions with a vLLM
engine (`lit_rlhf.generation.vllm.VLLMEngine`, built from the loaded policy, LoRA included;
`--vllm_kwargs` go to it as JSON) instead of our KV-cache sampler (`hf`, the default); a model
baseline is loaded into the same engine when its weights have the policy's names and shapes.

Conventions (shared with the callback):
- the policy is completion **a**, the baseline completion **b**: `win_rate` is the policy's win
  rate over the baseline, ties count half, invalid verdicts are excluded from it and counted in
  `invalid_rate` (see `lit_rlhf.judges.stats`), with a 95% Wilson interval;
- lengths are in **tokens of the policy's tokenizer** (the completion text re-encoded without
  special tokens, so EOS is not counted); `length_ratio` is mean policy length / mean baseline
  length, and the figure buckets the per-item log(len_policy / len_baseline) (N+ Figure 8);
- evaluation prompts are the first `num_prompts` distinct prompts of a split, in dataset order,
  so every evaluation of a run sees the same prompts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import torch

from lit_rlhf.generation import SamplingConfig, decode_responses, generate_responses
from lit_rlhf.judges import Judgement, LengthRatioBuckets, PairwiseJudge, WinRateStats, win_rate, win_rate_by_length_ratio

log = logging.getLogger(__name__)

GREEDY = SamplingConfig(max_new_tokens=53, temperature=1.0, do_sample=False)


# --------------------------------------------------------------------------------------------
# evaluation prompts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalPrompts:
    """A fixed set of evaluation prompts.

    prompts: the prompt texts as the policy reads them (the D2 query, a chat-templated prompt).
    judge_prompts: what the judge is shown as the prompt (the raw instruction when the data has
        one, e.g. UltraFeedback's `raw_prompt`, else `prompts`).
    prompt_ids: token ids of each prompt (no padding), as the DataModule encoded them.
    references: the reference completion of each prompt (None where the data has none).
    """

    prompts: list[str]
    judge_prompts: list[str]
    prompt_ids: list[list[int]]
    references: list[str | None]

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def key(self) -> str:
        """A hash of the prompt ids: equal keys mean the same evaluation set."""
        return hashlib.sha256(json.dumps(self.prompt_ids).encode()).hexdigest()[:16]

    def require_references(self) -> list[str]:
        missing = [i for i, r in enumerate(self.references) if r is None]
        if missing:
            raise ValueError(
                f"baseline 'reference' needs a reference completion for every evaluation prompt; "
                f"{len(missing)} of {len(self)} have none (first: prompt {missing[0]}). Use a split with "
                "references (TL;DR SFT/prompt data), set reference_column, or use baseline 'initial'"
            )
        return list(self.references)  # type: ignore[arg-type]


def prompts_from_dataset(ds: Any, num_prompts: int | None, reference_column: str = "reference",
                         tokenizer: Any = None, chat: bool = False) -> EvalPrompts:
    """The first `num_prompts` distinct prompts (by text) of a processed `lit_rlhf.data` dataset.

    Uses the dataset's "prompt" column, its "_prompt_ids" (or encodes the prompt with `tokenizer`
    when the column is missing), "raw_prompt" for the judge when present, and `reference_column`.
    """
    columns = set(ds.column_names)
    if "prompt" not in columns:
        raise ValueError(f"the evaluation dataset has no 'prompt' column (columns: {sorted(columns)})")
    if "_prompt_ids" not in columns and tokenizer is None:
        raise ValueError("the evaluation dataset has no '_prompt_ids' column: pass the tokenizer to encode prompts")
    seen: set[str] = set()
    rows: list[int] = []
    texts = ds["prompt"]
    for i, text in enumerate(texts):
        if text is None or text in seen:
            continue
        seen.add(text)
        rows.append(i)
        if num_prompts is not None and len(rows) >= num_prompts:
            break
    if not rows:
        raise ValueError("the evaluation dataset has no prompts")
    sub = ds.select(rows)
    prompts = list(sub["prompt"])
    if "_prompt_ids" in columns:
        prompt_ids = [list(map(int, ids)) for ids in sub["_prompt_ids"]]
    else:
        prompt_ids = [encode_prompt_text(tokenizer, p, chat) for p in prompts]
    judge_prompts = list(sub["raw_prompt"]) if "raw_prompt" in columns else prompts
    references = list(sub[reference_column]) if reference_column in columns else [None] * len(rows)
    return EvalPrompts(prompts, [j if j is not None else p for j, p in zip(judge_prompts, prompts)], prompt_ids,
                       references)


def prompts_from_texts(tokenizer: Any, prompts: Sequence[str], references: Sequence[str] | None = None,
                       chat: bool = False) -> EvalPrompts:
    """Evaluation prompts given as texts (encoded like the DataModules do; `chat`: the texts are
    already chat-templated, so no BOS is added)."""
    if not prompts:
        raise ValueError("prompts is empty")
    if references is not None and len(references) != len(prompts):
        raise ValueError(f"got {len(references)} references for {len(prompts)} prompts")
    ids = [encode_prompt_text(tokenizer, p, chat) for p in prompts]
    refs = list(references) if references is not None else [None] * len(prompts)
    return EvalPrompts(list(prompts), list(prompts), ids, refs)


def encode_prompt_text(tokenizer: Any, text: str, chat: bool = False) -> list[int]:
    from lit_rlhf.data.formatting import encode_prompt

    return encode_prompt(tokenizer, text, chat=chat)


# --------------------------------------------------------------------------------------------
# generation
# --------------------------------------------------------------------------------------------


def generate_completions(
    model: torch.nn.Module,
    tokenizer: Any,
    prompt_ids: Sequence[Sequence[int]],
    sampling: SamplingConfig = GREEDY,
    batch_size: int = 8,
    synced_gpus: bool = False,
    seed: int = 0,
    engine: Any = None,
) -> list[str]:
    """Completion texts (EOS and padding removed) of `model` for each prompt, in order.

    `engine`: a `lit_rlhf.generation.vllm.VLLMEngine` holding `model`'s weights samples instead
    of `generate_responses` (same settings and post-processing; its seeds come from the same
    forked, seeded RNG).

    Prompts are left padded in batches of `batch_size` (D5) and sampled with
    `lit_rlhf.generation.generate_responses` (D23 cut after the first EOS). Sampling runs under a
    forked RNG seeded with `seed`: the evaluation is reproducible and the training RNG stream is
    left untouched.
    """
    from lit_rlhf.data.collate import pad_left

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = next(model.parameters()).device
    texts: list[str] = []
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for start in range(0, len(prompt_ids), batch_size):
            ids, mask = pad_left(prompt_ids[start : start + batch_size], tokenizer.pad_token_id)  # (b, P)
            if engine is not None:
                response_ids, response_mask, _, _ = engine.generate(ids, mask, sampling, tokenizer.eos_token_id,
                                                                    tokenizer.pad_token_id)  # (b, R)
            else:
                response_ids, response_mask, _ = generate_responses(
                    model, ids.to(device), mask.to(device), sampling, tokenizer.eos_token_id, tokenizer.pad_token_id,
                    synced_gpus=synced_gpus,
                )  # (b, R)
            texts.extend(decode_responses(tokenizer, response_ids.cpu(), response_mask.cpu()))
    return texts


# --------------------------------------------------------------------------------------------
# judging and statistics
# --------------------------------------------------------------------------------------------


def judge_safely(judge: PairwiseJudge, prompts: list[str], completions_a: list[str],
                 completions_b: list[str]) -> list[Judgement]:
    """`judge.judge(...)`, but a judge that raises or returns the wrong number of verdicts makes
    every item `invalid` (with the reason in `error`) and logs a warning instead of raising."""
    n = len(prompts)
    try:
        out = list(judge.judge(list(prompts), list(completions_a), list(completions_b)))
    except Exception as err:  # a judge failure must never end a training run
        reason = f"judge raised {type(err).__name__}: {err}"
        log.warning("%s: %s; all %d items counted as invalid", type(judge).__name__, reason, n)
        return [Judgement("invalid", error=reason) for _ in range(n)]
    if len(out) != n:
        reason = f"judge returned {len(out)} judgements for {n} items"
        log.warning("%s: %s; all items counted as invalid", type(judge).__name__, reason)
        return [Judgement("invalid", error=reason) for _ in range(n)]
    invalid = sum(j.winner == "invalid" for j in out)
    if invalid:
        first = next(j.error for j in out if j.winner == "invalid")
        log.warning("%s: %d of %d verdicts invalid (first: %s)", type(judge).__name__, invalid, n, first)
    return out


class JudgeEvaluation(NamedTuple):
    """Everything one evaluation produced.

    stats: win rate of the policy (a) over the baseline (b) with its Wilson interval.
    metrics: flat floats named `{prefix}/{name}` (see `judge_metrics`).
    rows: one dict per prompt (prompt, policy, baseline, winner, raw, error, swapped, lengths).
    buckets: win rate per log(len_policy / len_baseline) bucket.
    """

    stats: WinRateStats
    metrics: dict[str, float]
    rows: list[dict[str, Any]]
    buckets: LengthRatioBuckets


def token_length(tokenizer: Any, text: str) -> int:
    """Length of a completion in tokens of `tokenizer`, without special tokens (EOS not counted)."""
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def judge_metrics(stats: WinRateStats, policy_lengths: Sequence[int], baseline_lengths: Sequence[int],
                  prefix: str = "val/judge") -> dict[str, float]:
    """`{prefix}/win_rate`, `win_rate_ci_low`, `win_rate_ci_high`, `tie_rate`, `invalid_rate`,
    `num_prompts`, `num_valid`, `policy_length_tokens`, `baseline_length_tokens` (means) and
    `length_ratio` (mean policy length / mean baseline length)."""
    mean_policy = sum(policy_lengths) / max(1, len(policy_lengths))
    mean_baseline = sum(baseline_lengths) / max(1, len(baseline_lengths))
    values = {
        "win_rate": stats.win_rate,
        "win_rate_ci_low": stats.ci_low,
        "win_rate_ci_high": stats.ci_high,
        "tie_rate": stats.tie_rate,
        "invalid_rate": stats.invalid_rate,
        "num_prompts": stats.n,
        "num_valid": stats.num_valid,
        "policy_length_tokens": mean_policy,
        "baseline_length_tokens": mean_baseline,
        "length_ratio": mean_policy / mean_baseline if mean_baseline > 0 else math.nan,
    }
    return {f"{prefix}/{k}": float(v) for k, v in values.items()}


def evaluate_completions(
    judge: PairwiseJudge,
    prompts: list[str],
    policy_texts: list[str],
    baseline_texts: list[str],
    tokenizer: Any,
    num_buckets: int = 6,
    prefix: str = "val/judge",
) -> JudgeEvaluation:
    """Judge policy (a) against baseline (b) on each prompt and summarise (never raises for a
    judge failure: see `judge_safely`)."""
    if not (len(prompts) == len(policy_texts) == len(baseline_texts)):
        raise ValueError(f"prompts, policy and baseline completions differ in number: "
                         f"{len(prompts)}, {len(policy_texts)}, {len(baseline_texts)}")
    judgements = judge_safely(judge, prompts, policy_texts, baseline_texts)
    len_policy = [token_length(tokenizer, t) for t in policy_texts]
    len_baseline = [token_length(tokenizer, t) for t in baseline_texts]
    stats = win_rate(judgements)
    rows = [
        {"prompt": p, "policy": a, "baseline": b, "winner": j.winner, "raw": j.raw, "error": j.error,
         "swapped": j.swapped, "policy_length_tokens": la, "baseline_length_tokens": lb}
        for p, a, b, j, la, lb in zip(prompts, policy_texts, baseline_texts, judgements, len_policy, len_baseline)
    ]
    buckets = win_rate_by_length_ratio(judgements, len_policy, len_baseline, num_buckets=num_buckets)
    return JudgeEvaluation(stats, judge_metrics(stats, len_policy, len_baseline, prefix), rows, buckets)


# --------------------------------------------------------------------------------------------
# presentation: markdown table and figure
# --------------------------------------------------------------------------------------------


# every character `str.splitlines` breaks on: a table row must stay one line
_LINE_BREAKS = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def markdown_cell(text: Any, max_chars: int = 500) -> str:
    """One markdown table cell: pipes escaped, line breaks (any kind) as <br>, cut to `max_chars` characters."""
    text = "" if text is None else str(text)
    if len(text) > max_chars:
        text = text[:max_chars] + " …"
    return _LINE_BREAKS.sub("<br>", text.replace("\\", "\\\\").replace("|", "\\|"))


VERDICTS = {"a": "policy", "b": "baseline", "tie": "tie", "invalid": "invalid"}


def examples_table(rows: Sequence[dict[str, Any]], max_rows: int = 8, max_chars: int = 500) -> str:
    """A markdown table of the first `max_rows` rows: prompt, both completions, verdict, judge output."""
    lines = ["| # | prompt | policy | baseline | verdict | judge output |", "|---|---|---|---|---|---|"]
    for i, row in enumerate(rows[:max_rows]):
        output = row.get("raw") or ""
        if row.get("error"):
            output = f"{output} (error: {row['error']})".strip()
        cells = [str(i), markdown_cell(row["prompt"], max_chars), markdown_cell(row["policy"], max_chars),
                 markdown_cell(row["baseline"], max_chars), VERDICTS.get(row["winner"], row["winner"]),
                 markdown_cell(output, max_chars)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def length_ratio_figure(buckets: LengthRatioBuckets, title: str = "policy win rate against length ratio"):
    """Win rate of the policy per log(len_policy / len_baseline) bucket, with Wilson 95% error bars
    and the number of judged items over each point (N+ paper, Figure 8)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 4))
    ax = fig.add_subplot(1, 1, 1)
    points = [(c, s) for c, s in zip(buckets.centres, buckets.stats) if s.num_valid > 0]
    if points:
        x = [c for c, _ in points]
        y = [s.win_rate for _, s in points]
        err = [[s.win_rate - s.ci_low for _, s in points], [s.ci_high - s.win_rate for _, s in points]]
        ax.errorbar(x, y, yerr=err, fmt="o-", capsize=3)
        for xi, (_, s) in zip(x, points):
            ax.annotate(f"n={s.num_valid}", (xi, 1.02), ha="center", fontsize=7)
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=1)
    ax.axvline(0.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("log(policy tokens / baseline tokens)")
    ax.set_ylabel("policy win rate")
    ax.set_ylim(0.0, 1.08)
    ax.set_title(title)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------


def build_judge(spec: str | dict, init_args: dict | None = None) -> PairwiseJudge:
    """A judge from a YAML file / dict `{class_path, init_args}` (or `{judge: {...}}`), or from a class
    path plus `init_args`, instantiated by jsonargparse like the callback's `judge:` in a config."""
    import yaml
    from jsonargparse import ArgumentParser

    if isinstance(spec, str) and Path(spec).is_file():
        spec = yaml.safe_load(Path(spec).read_text())
    if isinstance(spec, dict) and "judge" in spec and "class_path" not in spec:
        spec = spec["judge"]
    if isinstance(spec, str):
        spec = {"class_path": spec, "init_args": dict(init_args or {})}
    elif init_args:
        spec = {**spec, "init_args": {**spec.get("init_args", {}), **init_args}}
    if not isinstance(spec, dict) or "class_path" not in spec:
        raise ValueError(f"a judge is a class path or {{class_path, init_args}}, got {spec!r}")
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--judge", type=PairwiseJudge)
    cfg = parser.parse_object({"judge": spec})
    return parser.instantiate_classes(cfg).judge


def load_policy(name: str, device: str = "cpu", dtype: str | None = None) -> tuple[torch.nn.Module, Any]:
    """(causal LM, tokenizer) from a lit_rlhf `.ckpt`, an exported directory or a model name."""
    from lit_rlhf import models

    if name.endswith(".ckpt") and Path(name).is_file():
        from lit_rlhf.export import load_module

        module = load_module(name)
        model, tokenizer = module.policy, module.tokenizer
    else:
        tokenizer = models.load_tokenizer(name)
        model = models.load_causal_lm(name, tokenizer, dtype)
    return model.to(device).eval(), tokenizer


def parse_vllm_kwargs(text: str | None) -> dict[str, Any]:
    """`--vllm_kwargs`: a JSON object (None or empty: {})."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--vllm_kwargs must be a JSON object, got {text!r}: {err}") from err
    if not isinstance(value, dict):
        raise ValueError(f"--vllm_kwargs must be a JSON object, got {type(value).__name__}: {text!r}")
    return value


def weight_shapes(model: torch.nn.Module) -> tuple[str, dict[str, tuple[int, ...]]]:
    """The architecture and the (name, shape) of the weights a sampler gets from `model` (a LoRA
    model: its base's), to tell whether two models fit one engine."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model's base
    shapes = {}
    for name, param in inner.named_parameters():
        if "lora_" in name or ".modules_to_save." in name:
            continue
        shapes[name.replace(".base_layer.", ".").replace(".original_module.", ".")] = tuple(param.shape)
    return type(inner).__name__, shapes


def load_prompts(path: str, tokenizer: Any, data_class: str, split: str, num_prompts: int | None,
                 reference_column: str = "reference") -> EvalPrompts:
    """Evaluation prompts from split `split` of a `lit_rlhf.data` DataModule built on `path`."""
    import importlib

    module_name, _, class_name = data_class.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    dm = cls(path=path, tokenizer=tokenizer, train_split=None, val_split=split, test_split=None)
    return prompts_from_dataset(dm.dataset("val"), num_prompts, reference_column, tokenizer)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", required=True, help="exported HF dir, lit_rlhf .ckpt, or model name")
    parser.add_argument("--baseline", default="reference",
                        help="'reference' (the data's reference completions) or a policy like --policy")
    parser.add_argument("--prompts", required=True, help="data path: hub id, local file, bundled:<name>")
    parser.add_argument("--data_class", default="lit_rlhf.data.TLDRPromptDataModule")
    parser.add_argument("--split", default="validation", help="split to take prompts from (a local file is 'train')")
    parser.add_argument("--reference_column", default="reference")
    parser.add_argument("--judge", required=True, help="YAML file {class_path, init_args} or a class path")
    parser.add_argument("--judge_args", default=None, help="init args of --judge as a JSON/YAML dict")
    parser.add_argument("--num_prompts", type=int, default=64)
    parser.add_argument("--max_new_tokens", type=int, default=53)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--do_sample", action="store_true", help="sample (default: greedy)")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_buckets", type=int, default=6)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--output_dir", default=None, help="write metrics.json, judgements.jsonl and the figure here")
    parser.add_argument("--generation_backend", default="hf", choices=["hf", "vllm"],
                        help="who samples the completions: our KV-cache sampler (hf) or a vLLM engine (vllm)")
    parser.add_argument("--vllm_kwargs", default=None,
                        help="keyword arguments of the vLLM engine as a JSON dict (VLLMEngine.from_policy, vllm.LLM)")
    args = parser.parse_args(argv)
    vllm_kwargs = parse_vllm_kwargs(args.vllm_kwargs)
    if vllm_kwargs and args.generation_backend != "vllm":
        raise ValueError("--vllm_kwargs needs --generation_backend vllm")

    import yaml

    judge = build_judge(args.judge, yaml.safe_load(args.judge_args) if args.judge_args else None)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, do_sample=args.do_sample)
    model, tokenizer = load_policy(args.policy, args.device, args.dtype)
    prompts = load_prompts(args.prompts, tokenizer, args.data_class, args.split, args.num_prompts,
                           args.reference_column)
    engine = None
    if args.generation_backend == "vllm":
        from lit_rlhf.generation.vllm import VLLMEngine

        engine = VLLMEngine.from_policy(model, tokenizer, **vllm_kwargs)
    policy_texts = generate_completions(model, tokenizer, prompts.prompt_ids, sampling, args.batch_size, seed=args.seed,
                                        engine=engine)
    if args.baseline == "reference":
        baseline_texts = prompts.require_references()
    else:
        shapes = weight_shapes(model)
        del model
        baseline_model, _ = load_policy(args.baseline, args.device, args.dtype)
        if engine is not None:
            if weight_shapes(baseline_model) == shapes:  # same architecture: the engine takes its weights
                engine.sync_weights(baseline_model)
            else:
                del engine
                engine = VLLMEngine.from_policy(baseline_model, tokenizer, **vllm_kwargs)
        baseline_texts = generate_completions(baseline_model, tokenizer, prompts.prompt_ids, sampling,
                                              args.batch_size, seed=args.seed, engine=engine)
    evaluation = evaluate_completions(judge, prompts.judge_prompts, policy_texts, baseline_texts, tokenizer,
                                      args.num_buckets)
    if args.output_dir:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps(evaluation.metrics, indent=2))
        with open(out / "judgements.jsonl", "w") as f:
            for row in evaluation.rows:
                f.write(json.dumps(row) + "\n")
        length_ratio_figure(evaluation.buckets).savefig(out / "win_rate_by_length_ratio.png")
    print(json.dumps(evaluation.metrics, indent=2))
    return evaluation.metrics


if __name__ == "__main__":
    main()
