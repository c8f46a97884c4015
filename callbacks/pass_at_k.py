"""avg@k, pass@k and maj@k of the policy on held-out problems of a verifiable task, during training.

Every `every_n_steps` optimizer steps and/or at the end of each validation run, the policy samples
`n` answers to each of a fixed set of problems (the first `num_prompts` distinct prompts of the
DataModule's `split`, a `QADataModule` with reference answers), each checked by the verifiable
reward's checker (`lit_rlhf.evaluation.verifiable`):

    trainer:
      callbacks:
        - class_path: callbacks.PassAtKCallback
          init_args:
            n: 8
            ks: [1, 4, 8]
            num_prompts: 60
            sampling: {max_new_tokens: 16, temperature: 1.0, do_sample: true}

To measure a saved policy (or two, paired), see `python -m lit_rlhf.apps.pass_at_k`.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch
from lightning import LightningModule, Trainer

from callbacks.judge_eval import policy_sampler
from callbacks.scheduled import ScheduledEvaluation
from lit_rlhf.evaluation import EvalPrompts, prompts_from_dataset
from lit_rlhf.evaluation.pass_at_k import summarise
from lit_rlhf.evaluation.verifiable import sample_answers
from lit_rlhf.generation import SamplingConfig, needs_synced_gpus
from lit_rlhf.lightning_compat import callback_state_key
from lit_rlhf.online import VLLMSampler

log = logging.getLogger(__name__)


def metric_key(prefix: str, name: str) -> str:
    """`pass@4` -> `{prefix}/pass_at_4`: `@` is spelled out, since some loggers (MLflow) refuse it."""
    return f"{prefix}/{name.replace('@', '_at_')}"


class PassAtKCallback(ScheduledEvaluation):
    """Sampled accuracy of the policy on held-out verifiable problems.

    What is logged (to every logger, at `trainer.global_step`; `{prefix}` = `val/verifiable`), for
    each k of `ks`: `{prefix}/avg_at_{k}`, `{prefix}/pass_at_{k}`, `{prefix}/maj_at_{k}` (the means
    over problems, `lit_rlhf.evaluation.pass_at_k`), each with its 95% bootstrap interval over
    problems (`..._ci_low`, `..._ci_high`), and `{prefix}/num_problems`. The same values go to
    `trainer.callback_metrics` (for checkpointing on `val/verifiable/pass_at_1`) and to `history`.

    Args:
        n: samples per problem.
        ks: the k of each metric (each <= n).
        num_prompts: the first distinct problems of the split.
        split: the DataModule role the problems come from (`val` or `test`).
        sampling: how the policy samples (`do_sample: true`; its temperature, top-p, length).
        batch_size: rows sampled together (a multiple of n keeps a problem in one batch).
        seed: the sampling seed (a forked RNG: the training RNG stream is untouched).
        every_n_steps: also evaluate every n optimizer steps (0: only at validation end).
        at_validation_end: evaluate at the end of each validation run.
        prefix: the metric names' prefix.
        num_resamples: bootstrap resamples of the intervals.
    """

    def __init__(self, n: int = 8, ks: Sequence[int] = (1, 4, 8), num_prompts: int = 60, split: str = "val",
                 sampling: SamplingConfig | None = None, batch_size: int = 16, seed: int = 0, every_n_steps: int = 0,
                 at_validation_end: bool = True, prefix: str = "val/verifiable", num_resamples: int = 1000) -> None:
        self.ks = [int(k) for k in ks]
        if not self.ks or min(self.ks) < 1 or max(self.ks) > n:
            raise ValueError(f"PassAtKCallback: every k of ks must be in 1..n={n}, got {list(ks)}")
        self.sampling = sampling or SamplingConfig(max_new_tokens=64, temperature=1.0, do_sample=True)
        if n > 1 and not self.sampling.do_sample:
            raise ValueError("PassAtKCallback: n > 1 samples need sampling.do_sample: true")
        self.n, self.num_prompts, self.split = n, num_prompts, split
        self.batch_size, self.seed, self.every_n_steps = batch_size, seed, every_n_steps
        self.at_validation_end, self.prefix, self.num_resamples = at_validation_end, prefix, num_resamples
        self._prompts: EvalPrompts | None = None
        self._last_step: int | None = None
        self.history: list[dict[str, float]] = []

    def evaluate(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, float]:
        """Sample, check and summarise (rank 0), log, and return the metrics (the same on every rank)."""
        self._last_step = trainer.global_step
        prompts = self.eval_prompts(trainer, pl_module)
        synced = needs_synced_gpus(trainer)
        metrics: dict[str, float] | None = None
        if trainer.is_global_zero or synced:
            engine = None  # a module sampling with a colocated vLLM engine evaluates with it
            source = getattr(pl_module, "rollout_source", None)
            if isinstance(source, VLLMSampler):
                engine = source.synced_engine(pl_module.sampled_model())
            with trainer.precision_plugin.forward_context(), policy_sampler(pl_module.policy) as sampler:
                answers = sample_answers(sampler, pl_module.tokenizer, prompts, self.n, self.ks, self.sampling,
                                         self.batch_size, self.seed, synced_gpus=synced, engine=engine)
            if trainer.is_global_zero:
                metrics = self._metrics(summarise(answers.values, self.num_resamples), len(prompts))
                log.info("step %d: %s", trainer.global_step,
                         ", ".join(f"{k.rsplit('/', 1)[1]} {v:.3f}" for k, v in metrics.items() if "_ci_" not in k))
                for logger in trainer.loggers:
                    logger.log_metrics(metrics, step=trainer.global_step)
        metrics = trainer.strategy.broadcast(metrics, src=0)
        for name, value in metrics.items():
            trainer.callback_metrics[name] = torch.tensor(value)
        self.history.append({"step": float(trainer.global_step), **metrics})
        return metrics

    def _metrics(self, summary: dict[str, Any], num_problems: int) -> dict[str, float]:
        out = {f"{self.prefix}/num_problems": float(num_problems)}
        for name, s in summary.items():
            key = metric_key(self.prefix, name)
            out.update({key: s["mean"], f"{key}_ci_low": s["ci_low"], f"{key}_ci_high": s["ci_high"]})
        return out

    def eval_prompts(self, trainer: Trainer, pl_module: LightningModule) -> EvalPrompts:
        """The fixed problems (built on first use) from the trainer's DataModule."""
        if self._prompts is None:
            dm = getattr(trainer, "datamodule", None)
            if dm is None or not callable(getattr(dm, "dataset", None)):
                raise ValueError("PassAtKCallback needs a lit_rlhf.data DataModule with reference answers "
                                 f"(a QADataModule); the trainer has {type(dm).__name__}")
            self._prompts = prompts_from_dataset(dm.dataset(self.split), self.num_prompts, "reference",
                                                 pl_module.tokenizer)
            self._prompts.require_references()
        return self._prompts

    @property
    def state_key(self) -> str:
        return callback_state_key(self, prefix=self.prefix)

    def state_dict(self) -> dict[str, Any]:
        return {"history": [dict(h) for h in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [dict(h) for h in state_dict.get("history", [])]
