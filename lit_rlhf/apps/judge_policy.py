"""Judge a saved policy's completions against a baseline with a pairwise judge
(docs/guides/evaluation.md; `callbacks.JudgeEvalCallback` judges during training).

    python -m lit_rlhf.apps.judge_policy \\
        --policy outputs/tldr/dpo/hf            # an exported HF dir, a .ckpt, or a model name
        --baseline reference                    # the data's reference completions, or a model
        --prompts vwxyzjn/summarize_from_feedback_tldr_3_filtered --split validation \\
        --judge judge.yaml                      # {class_path: lit_rlhf.judges.LocalLMJudge, init_args: {...}}
        --num_prompts 256 --max_new_tokens 53 --output_dir outputs/tldr/dpo/judge
        [--generation_backend vllm --vllm_kwargs '{"max_model_len": 1024}']

`--judge`: a YAML file of `{class_path, init_args}` (optionally under `judge:`), or a class path
with `--judge_args`. Writes `metrics.json`, `judgements.jsonl` and `win_rate_by_length_ratio.png`.
`--generation_backend vllm` samples with `VLLMEngine` (a same-shaped model baseline shares it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from lit_rlhf.apps import import_class, write_results
from lit_rlhf.evaluation import EvalPrompts, evaluate_completions, generate_completions, length_ratio_figure, prompts_from_dataset
from lit_rlhf.generation import SamplingConfig
from lit_rlhf.judges import PairwiseJudge


def build_judge(spec: str | dict, init_args: dict | str | None = None) -> PairwiseJudge:
    """A judge from a YAML file / dict `{class_path, init_args}` (or `{judge: {...}}`), or from a class
    path plus `init_args` (a dict, or its JSON/YAML text), instantiated by jsonargparse like the
    callback's `judge:` in a config."""
    import yaml
    from jsonargparse import ArgumentParser

    if isinstance(init_args, str):
        init_args = yaml.safe_load(init_args)
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
    build = getattr(parser, "instantiate", None) or parser.instantiate_classes  # jsonargparse >= 4.49: instantiate
    return build(cfg).judge


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
    return type(inner).__name__, {
        name.replace(".base_layer.", ".").replace(".original_module.", "."): tuple(param.shape)
        for name, param in inner.named_parameters() if "lora_" not in name and ".modules_to_save." not in name}


def load_prompts(path: str, tokenizer: Any, data_class: str, split: str, num_prompts: int | None,
                 reference_column: str = "reference") -> EvalPrompts:
    """Evaluation prompts from split `split` of a `lit_rlhf.data` DataModule built on `path`."""
    dm = import_class(data_class)(path=path, tokenizer=tokenizer, train_split=None, val_split=split, test_split=None)
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

    judge = build_judge(args.judge, args.judge_args)
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
        out = write_results(args.output_dir, evaluation.metrics, "judgements.jsonl", evaluation.rows)
        length_ratio_figure(evaluation.buckets).savefig(out / "win_rate_by_length_ratio.png")
    print(json.dumps(evaluation.metrics, indent=2))
    return evaluation.metrics


if __name__ == "__main__":
    from lit_rlhf.apps import run

    run(main)
