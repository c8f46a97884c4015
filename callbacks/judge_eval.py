"""Pairwise-judge evaluation of the policy during training.

Every `every_n_steps` optimizer steps and/or at the end of each validation run, the policy
completes a fixed set of evaluation prompts and a `PairwiseJudge` compares each completion with a
baseline: the data's reference completions (TL;DR human summaries) or the completions of the
initial policy (generated once and cached, also in the checkpoint).

    trainer:
      callbacks:
        - class_path: callbacks.JudgeEvalCallback
          init_args:
            judge:
              class_path: lit_rlhf.judges.LocalLMJudge
              init_args: {model_name: HuggingFaceTB/SmolLM2-1.7B-Instruct, template: tldr, device: cuda}
            baseline: reference
            num_prompts: 256
            sampling: {max_new_tokens: 53, do_sample: false, temperature: 1.0}

It also runs under `python main.py validate --config ... --ckpt_path ...`; to judge an exported
policy without a trainer, see `python -m lit_rlhf.apps.judge_policy`.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Literal

import torch
from lightning import LightningModule, Trainer

from callbacks.scheduled import ScheduledEvaluation
from lit_rlhf.generation import SamplingConfig, needs_synced_gpus
from lit_rlhf.evaluation import (
    GREEDY,
    EvalPrompts,
    JudgeEvaluation,
    evaluate_completions,
    examples_table,
    generate_completions,
    length_ratio_figure,
    prompts_from_dataset,
    prompts_from_texts,
)
from lit_rlhf.judges import PairwiseJudge
from lit_rlhf.lightning_compat import callback_state_key
from lit_rlhf.models import adapters
from lit_rlhf.online import VLLMSampler

log = logging.getLogger(__name__)

Baseline = Literal["reference", "initial"]


class JudgeEvalCallback(ScheduledEvaluation):
    """Win rate of the policy against a baseline, judged by a pairwise judge.

    What is logged (to every logger, at `trainer.global_step`; `{prefix}` = `val/judge`):
    - `{prefix}/win_rate` (policy over baseline, ties as half, invalid verdicts excluded) with its
      Wilson 95% interval `{prefix}/win_rate_ci_low`, `{prefix}/win_rate_ci_high`;
      `{prefix}/tie_rate`, `{prefix}/invalid_rate`, `{prefix}/num_prompts`, `{prefix}/num_valid`;
    - mean completion lengths in **tokens of the policy tokenizer** (EOS not counted):
      `{prefix}/policy_length_tokens`, `{prefix}/baseline_length_tokens`, and `{prefix}/length_ratio`
      (mean policy length / mean baseline length);
    - with a TensorBoardLogger: a markdown table of examples (`{prefix}/examples`: prompt, both
      completions, verdict, judge output) and a figure of the win rate per log(length ratio)
      bucket (`{prefix}/win_rate_by_length_ratio`, N+ Figure 8). Other loggers get the scalars only.
    The metrics also go to `trainer.callback_metrics` (a ModelCheckpoint can monitor them).

    Evaluation prompts, in this order of precedence: `prompts` (texts; `references` optional); a
    DataModule of class `data_class` built on `path` with the module's tokenizer; the trainer's
    DataModule. From a DataModule they are the first `num_prompts` distinct prompts of split
    `split` (dataset order, so every evaluation uses the same prompts), with their token ids as the
    DataModule encoded them and the `reference_column` as reference completion. Any `lit_rlhf.data`
    DataModule works (SFT, preference, prompt): every one has a "prompt" column.

    Distributed runs: the judge runs on rank 0 only, on all prompts, and rank 0 broadcasts the
    metrics, so the win rate is global. Under plain DDP only rank 0 generates; under sharded
    strategies (ZeRO-3, FSDP) every rank generates the same prompts with `synced_gpus=True`
    (every rank must take part in each forward pass) and rank 0's completions are judged.

    A judge that fails never stops training: its items are counted as invalid (`invalid_rate`)
    and a warning is logged.

    Args:
        judge: the `PairwiseJudge` (from YAML: `{class_path: lit_rlhf.judges.LocalLMJudge, init_args: ...}`).
        baseline: `reference` (the data's reference completions) or `initial` (completions of the
            initial policy: `baseline_model` when set, else the module's `ref_model` when it has one,
            else, with LoRA, the policy's own base with its adapters off (nothing loaded), else the
            module's `model` loaded afresh; generated once, cached and checkpointed). A LoRA
            policy samples with exactly its `policy` adapter on.
        baseline_model: model name or directory of the `initial` baseline (overrides `ref_model`).
        num_prompts: number of evaluation prompts (fewer when the split has fewer).
        every_n_steps: evaluate after every N-th optimizer step (0 = never during training).
        on_validation_end: evaluate at the end of every validation run (not the sanity check).
        sampling: how the policy (and an `initial` baseline) generates; greedy by default.
        batch_size: prompts per `generate` call.
        seed: seed of the (forked) RNG used for sampled generation; the training RNG is untouched.
        prompts: explicit prompt texts (as the policy reads them), instead of a DataModule.
        references: reference completions of `prompts` (needed for `baseline: reference`).
        chat: the explicit `prompts` are chat-templated text (encoded without an added BOS).
        path: dataset path / hub id / bundled alias to build the prompt DataModule from.
        data_class: DataModule class built as `data_class(path=path, tokenizer=<module tokenizer>)`.
        split: the DataModule split role whose prompts are used: `val` (default), `train` or `test`.
        reference_column: the dataset column holding reference completions.
        num_examples: rows of the TensorBoard examples table.
        max_chars: characters kept per table cell.
        num_buckets: buckets of the log length-ratio figure.
        prefix: metric name prefix.
    """

    def __init__(
        self,
        judge: PairwiseJudge,
        baseline: Baseline = "reference",
        baseline_model: str | None = None,
        num_prompts: int = 64,
        every_n_steps: int = 0,
        on_validation_end: bool = True,
        sampling: SamplingConfig = GREEDY,
        batch_size: int = 8,
        seed: int = 0,
        prompts: list[str] | None = None,
        references: list[str] | None = None,
        chat: bool = False,
        path: str | None = None,
        data_class: str = "lit_rlhf.data.TLDRPromptDataModule",
        split: str = "val",
        reference_column: str = "reference",
        num_examples: int = 8,
        max_chars: int = 500,
        num_buckets: int = 6,
        prefix: str = "val/judge",
    ) -> None:
        if not isinstance(judge, PairwiseJudge):
            raise TypeError(f"judge must be a lit_rlhf.judges.PairwiseJudge, got {type(judge).__name__}")
        if baseline not in ("reference", "initial"):
            raise ValueError(f"baseline must be 'reference' or 'initial', got {baseline!r}")
        if num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
        if every_n_steps < 0:
            raise ValueError(f"every_n_steps must be >= 0, got {every_n_steps}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if references is not None and prompts is None:
            raise ValueError("references are given without prompts")
        self.judge = judge
        self.baseline = baseline
        self.baseline_model = baseline_model
        self.num_prompts = num_prompts
        self.every_n_steps = every_n_steps
        # stored under another name: `on_validation_end` is a Callback hook
        self.at_validation_end = on_validation_end
        self.sampling = sampling
        self.batch_size = batch_size
        self.seed = seed
        self.prompt_texts = prompts
        self.references = references
        self.chat = chat
        self.path = path
        self.data_class = data_class
        self.split = split
        self.reference_column = reference_column
        self.num_examples = num_examples
        self.max_chars = max_chars
        self.num_buckets = num_buckets
        self.prefix = prefix.rstrip("/")
        self._prompts: EvalPrompts | None = None
        self._baseline_cache: dict[str, Any] | None = None  # {"key", "source", "completions"}
        self._last_step: int | None = None
        self.history: list[dict[str, float]] = []  # metrics of every evaluation, with "step"
        self.last_evaluation: JudgeEvaluation | None = None  # rank 0 only

    # ----------------------------------------------------------------------------------------
    # when
    # ----------------------------------------------------------------------------------------

    # ----------------------------------------------------------------------------------------
    # what
    # ----------------------------------------------------------------------------------------

    def evaluate(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, float]:
        """Generate, judge (rank 0), log, and return the metrics (the same on every rank)."""
        self._last_step = trainer.global_step
        tokenizer = pl_module.tokenizer
        prompts = self.eval_prompts(trainer, pl_module)
        synced = needs_synced_gpus(trainer)
        generates = trainer.is_global_zero or synced
        policy_texts = self._generate(trainer, pl_module.policy, tokenizer, prompts, synced) if generates else None
        baseline_texts = self.baseline_completions(trainer, pl_module, prompts)
        metrics: dict[str, float] | None = None
        if trainer.is_global_zero:
            evaluation = evaluate_completions(self.judge, prompts.judge_prompts, policy_texts, baseline_texts,
                                              tokenizer, self.num_buckets, self.prefix)
            self.last_evaluation = evaluation
            metrics = evaluation.metrics
            self._log_rank_zero(trainer, evaluation)
        metrics = trainer.strategy.broadcast(metrics, src=0)
        for name, value in metrics.items():
            trainer.callback_metrics[name] = torch.tensor(value)
        self.history.append({"step": float(trainer.global_step), **metrics})
        return metrics

    def eval_prompts(self, trainer: Trainer, pl_module: LightningModule) -> EvalPrompts:
        """The fixed evaluation prompts (built on first use)."""
        if self._prompts is None:
            tokenizer = pl_module.tokenizer
            if self.prompt_texts is not None:
                self._prompts = prompts_from_texts(tokenizer, self.prompt_texts[: self.num_prompts],
                                                   None if self.references is None else self.references[: self.num_prompts],
                                                   chat=self.chat)
            else:
                dm = self._datamodule(trainer, pl_module)
                self._prompts = prompts_from_dataset(dm.dataset(self.split), self.num_prompts, self.reference_column,
                                                     tokenizer, chat=self.chat)
            if self.baseline == "reference":
                self._prompts.require_references()
        return self._prompts

    def _datamodule(self, trainer: Trainer, pl_module: LightningModule) -> Any:
        if self.path is not None:
            module_name, _, class_name = self.data_class.rpartition(".")
            cls = getattr(importlib.import_module(module_name), class_name)
            return cls(path=self.path, tokenizer=pl_module.tokenizer)
        dm = getattr(trainer, "datamodule", None)
        if dm is None or not callable(getattr(dm, "dataset", None)):
            raise ValueError(
                "JudgeEvalCallback needs evaluation prompts: give `prompts`, or `path` (with `data_class`), "
                f"or train with a lit_rlhf.data DataModule (the trainer has {type(dm).__name__})"
            )
        return dm

    def baseline_completions(self, trainer: Trainer, pl_module: LightningModule, prompts: EvalPrompts) -> list[str] | None:
        """Reference completions, or the initial policy's completions (generated once, cached)."""
        if self.baseline == "reference":
            return prompts.require_references()
        source = self._baseline_source(pl_module)
        cache = self._baseline_cache
        if cache is not None and cache["key"] == prompts.key and cache["source"] == source:
            return list(cache["completions"])
        if cache is not None:
            log.warning("JudgeEvalCallback: the cached baseline (%s, prompts %s) does not match (%s, prompts %s); "
                        "regenerating it", cache["source"], cache["key"], source, prompts.key)
        synced = needs_synced_gpus(trainer)
        texts = None
        if trainer.is_global_zero or synced:
            model, owned = self._baseline_lm(pl_module)
            texts = self._generate(trainer, model, pl_module.tokenizer, prompts, synced)
            if owned:
                del model
        texts = trainer.strategy.broadcast(texts, src=0)  # every rank keeps the same cache
        self._baseline_cache = {"key": prompts.key, "source": source, "completions": list(texts)}
        return list(texts)

    def _baseline_source(self, pl_module: LightningModule) -> str:
        if self.baseline_model is not None:
            return self.baseline_model
        if getattr(pl_module, "ref_model", None) is not None:
            return "ref_model"
        return str(pl_module.hparams.get("model"))

    def _baseline_lm(self, pl_module: LightningModule) -> tuple[torch.nn.Module, bool]:
        """(model, whether it was loaded here and can be dropped after use)."""
        from lit_rlhf import models

        if self.baseline_model is None and getattr(pl_module, "ref_model", None) is not None:
            return pl_module.ref_model, False
        if self.baseline_model is None and getattr(pl_module, "lora_config", None) is not None:
            return adapters.AdapterView(pl_module.policy, None), False  # the frozen base, adapters off
        name = self.baseline_model or pl_module.hparams.get("model")
        if not name:
            raise ValueError("baseline 'initial' needs baseline_model, a module ref_model, or a module `model` name")
        model = models.load_causal_lm(name, pl_module.tokenizer, pl_module.hparams.get("dtype"))
        return model.to(pl_module.device).eval(), True

    def _generate(self, trainer: Trainer, model: torch.nn.Module, tokenizer: Any, prompts: EvalPrompts,
                  synced: bool) -> list[str]:
        module = trainer.lightning_module
        engine = None  # the policy of a module that samples with a colocated vLLM engine samples with it
        source = getattr(module, "rollout_source", None)
        if model is getattr(module, "policy", None) and isinstance(source, VLLMSampler):
            engine = source.synced_engine(module.sampled_model())
        with trainer.precision_plugin.forward_context(), policy_sampler(model) as sampler:
            return generate_completions(sampler, tokenizer, prompts.prompt_ids, self.sampling, self.batch_size,
                                        synced_gpus=synced, seed=self.seed, engine=engine)

    # ----------------------------------------------------------------------------------------
    # logging (rank 0)
    # ----------------------------------------------------------------------------------------

    def _log_rank_zero(self, trainer: Trainer, evaluation: JudgeEvaluation) -> None:
        from lightning.pytorch.loggers import TensorBoardLogger

        step = trainer.global_step
        stats = evaluation.stats
        log.info("step %d: judge win rate %.3f [%.3f, %.3f] over %d valid of %d (invalid %d)", step, stats.win_rate,
                 stats.ci_low, stats.ci_high, stats.num_valid, stats.n, stats.invalid)
        for logger in trainer.loggers:
            logger.log_metrics(evaluation.metrics, step=step)
            if not isinstance(logger, TensorBoardLogger):
                continue
            try:
                experiment = logger.experiment
                experiment.add_text(f"{self.prefix}/examples",
                                    examples_table(evaluation.rows, self.num_examples, self.max_chars), step)
                experiment.add_figure(f"{self.prefix}/win_rate_by_length_ratio",
                                      length_ratio_figure(evaluation.buckets), step, close=True)
            except Exception as err:  # presentation must not end a run
                log.warning("JudgeEvalCallback: could not write the table/figure to TensorBoard: %s", err)

    # ----------------------------------------------------------------------------------------
    # checkpointed state
    # ----------------------------------------------------------------------------------------

    @property
    def state_key(self) -> str:
        # several judge callbacks (other baselines, judges or prefixes) can share a trainer
        return callback_state_key(self, prefix=self.prefix, baseline=self.baseline)

    def state_dict(self) -> dict[str, Any]:
        return {"baseline_cache": None if self._baseline_cache is None else dict(self._baseline_cache),
                "history": [dict(h) for h in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        cache = state_dict.get("baseline_cache")
        self._baseline_cache = None if cache is None else dict(cache)
        self.history = [dict(h) for h in state_dict.get("history", [])]


def policy_sampler(model: Any):
    """A context giving the module `generate_completions` samples with: an `AdapterView`'s shared
    base under its adapter (the reference view: none), so the sampler switches the real model to
    eval mode (a training-mode model with gradient checkpointing drops the KV cache); a LoRA policy
    (a model holding the `policy` adapter) under exactly that adapter; any other model as it is."""
    if not isinstance(model, adapters.AdapterView) and adapters.POLICY in adapters.adapter_names(model):
        model = adapters.AdapterView(model, adapters.POLICY)
    return adapters.activated(model)
