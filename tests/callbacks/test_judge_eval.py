"""JudgeEvalCallback and `python -m lit_rlhf.apps.judge_policy` on the tiny model and the bundled TL;DR data.

- a CLI fit (SFTModule, TLDRSFTDataModule on bundled:tldr_sft, LocalLMJudge from YAML) logs the
  win-rate scalars, the examples table and the length-ratio figure to TensorBoard;
- a fake judge (the longer completion wins; "INVALID" prompts are invalid) checks the win rate,
  its Wilson interval, tie/invalid rates and lengths by hand, end to end through `trainer.validate`;
- a judge that raises does not stop a fit (a second callback in the same CLI fit);
- the `initial` baseline is generated once, kept in the checkpoint and reused after a resume;
- a LoRA policy samples with its adapter, the `initial` baseline is its base with the adapter off;
- the entry point judges an exported tiny policy against the reference summaries.
"""

from __future__ import annotations

import json
import math

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.loggers import CSVLogger

import callbacks.judge_eval as judge_eval
from callbacks import JudgeEvalCallback
from lit_rlhf.training.memory import Memory
from lit_rlhf.cli import main
from lit_rlhf.data import TLDRSFTDataModule
from lit_rlhf.generation import SamplingConfig
from lit_rlhf.evaluation import examples_table, generate_completions, markdown_cell, prompts_from_texts
from lit_rlhf.judges import Judgement, PairwiseJudge, wilson_interval
from lit_rlhf.modules import SFTModule

SHORT = SamplingConfig(max_new_tokens=6, temperature=1.0, do_sample=False)


class LongerWins(PairwiseJudge):
    """Prefers the longer completion (characters); equal lengths tie; prompts with INVALID are invalid."""

    def __init__(self):
        self.calls = 0

    def judge(self, prompts, completions_a, completions_b):
        self.calls += 1
        out = []
        for p, a, b in zip(prompts, completions_a, completions_b):
            if "INVALID" in p:
                out.append(Judgement("invalid", raw="?", error="unparseable"))
            else:
                out.append(Judgement("a" if len(a) > len(b) else "b" if len(b) > len(a) else "tie", raw=f"{len(a)}|{len(b)}"))
        return out


class Broken(PairwiseJudge):
    def judge(self, prompts, completions_a, completions_b):
        raise ConnectionError("judge endpoint down")


def _trainer(tmp_path, steps=2, **kwargs):
    defaults = dict(max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0,
                    limit_val_batches=1, enable_checkpointing=False)
    defaults.update(kwargs)
    return L.Trainer(**defaults)


def _datamodule(**kwargs):
    return TLDRSFTDataModule(path="bundled:tldr_sft", tokenizer="tiny-random-llama", batch_size=4, **kwargs)


def test_cli_fit_logs_win_rate_table_and_figure_to_tensorboard(tmp_path, caplog):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = {
        "trainer": {
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                       "init_args": {"save_dir": str(tmp_path / "tb"), "name": "judge"}},
            "callbacks": [{
                "class_path": "callbacks.JudgeEvalCallback",
                "init_args": {
                    "judge": {"class_path": "lit_rlhf.judges.LocalLMJudge",
                              "init_args": {"model_name": "tiny-random-llama", "template": "tldr", "seed": 3}},
                    "baseline": "reference", "num_prompts": 5, "batch_size": 3,
                    "sampling": {"max_new_tokens": 6, "do_sample": False, "temperature": 1.0},
                },
            }, {  # a second judge that always fails, after every step: training goes on
                "class_path": "callbacks.JudgeEvalCallback",
                "init_args": {"judge": {"class_path": "tests.callbacks.test_judge_eval.Broken"}, "num_prompts": 3,
                              "every_n_steps": 1, "on_validation_end": False, "prefix": "val/broken_judge",
                              "sampling": {"max_new_tokens": 2}},
            }],
        },
        "model": {"class_path": "lit_rlhf.modules.SFTModule", "init_args": {"lr": 1e-4}},
        "data": {"class_path": "lit_rlhf.data.TLDRSFTDataModule", "init_args": {"batch_size": 4}},
    }
    cfg = tmp_path / "judge.yaml"
    cfg.write_text(yaml.safe_dump(config))
    with caplog.at_level("WARNING"):
        cli = main([
            "fit", "--config", str(cfg), "--trainer.max_steps=2", "--trainer.accelerator=cpu", "--trainer.precision=32",
            "--trainer.default_root_dir", str(tmp_path), "--trainer.val_check_interval=2",
            "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0", "--trainer.enable_checkpointing=false",
            "--model.init_args.model=tiny-random-llama", "--data.init_args.path=bundled:tldr_sft",
        ])
    trainer = cli.trainer
    assert trainer.global_step == 2
    callback, broken = [cb for cb in trainer.callbacks if isinstance(cb, JudgeEvalCallback)]
    # the failing judge: every item invalid, a warning, and the fit finished
    assert [h["step"] for h in broken.history] == [1.0, 2.0]
    assert all(h["val/broken_judge/invalid_rate"] == 1.0 and math.isnan(h["val/broken_judge/win_rate"])
               for h in broken.history)
    assert "judge endpoint down" in caplog.text
    assert broken.last_evaluation.rows[0]["error"].startswith("judge raised ConnectionError")

    assert len(callback.history) == 1 and callback.history[0]["step"] == 2.0
    evaluation = callback.last_evaluation
    assert len(evaluation.rows) == 5
    # the baseline is the human reference summary of each prompt (D3: leading space)
    dm_refs = cli.datamodule.dataset("val")["reference"][:5]
    assert [r["baseline"] for r in evaluation.rows] == dm_refs and all(r.startswith(" ") for r in dm_refs)

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/judge/")}
    assert metrics["val/judge/num_prompts"] == 5 and metrics["val/judge/invalid_rate"] == 0.0
    assert 0.0 <= metrics["val/judge/win_rate_ci_low"] <= metrics["val/judge/win_rate"] <= metrics["val/judge/win_rate_ci_high"] <= 1.0
    assert metrics["val/judge/baseline_length_tokens"] > 0
    assert math.isclose(metrics["val/judge/length_ratio"],
                        metrics["val/judge/policy_length_tokens"] / metrics["val/judge/baseline_length_tokens"], rel_tol=1e-6)

    acc = EventAccumulator(trainer.logger.log_dir, size_guidance={"tensors": 0, "images": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    for name in ("win_rate", "win_rate_ci_low", "win_rate_ci_high", "tie_rate", "invalid_rate",
                 "policy_length_tokens", "baseline_length_tokens", "length_ratio"):
        events = acc.Scalars(f"val/judge/{name}")
        assert [e.step for e in events] == [2], name
        assert math.isclose(events[0].value, metrics[f"val/judge/{name}"], rel_tol=1e-6), name
    table = acc.Tensors("val/judge/examples/text_summary")[-1].tensor_proto.string_val[0].decode()
    lines = table.splitlines()
    assert lines[0] == "| # | prompt | policy | baseline | verdict | judge output |"
    assert len(lines) == 2 + 5 and "SUBREDDIT: r/" in lines[2] and "P(A)=" in lines[2]
    assert all(line.count(" | ") == 5 for line in lines[2:])  # newlines and pipes escaped: 6 cells a row
    assert "val/judge/win_rate_by_length_ratio" in tags["images"]


def test_fake_judge_win_rate_arithmetic_end_to_end(tmp_path):
    module = SFTModule(model="tiny-random-llama")
    prompts = [f"Q{i}: say something.\nA:" for i in range(5)] + ["Q5 INVALID\nA:"]
    references = ["", "", "x" * 300, " word", "x" * 300, ""]
    judge = LongerWins()
    callback = JudgeEvalCallback(judge, baseline="reference", prompts=prompts, references=references,
                                 sampling=SHORT, batch_size=4, num_buckets=3)
    csv = CSVLogger(tmp_path / "csv")
    _trainer(tmp_path, logger=csv, callbacks=[callback]).validate(module, datamodule=_datamodule(limit=4))
    assert judge.calls == 1

    # what the policy says, independently of the callback (greedy, so the same)
    ids = prompts_from_texts(module.tokenizer, prompts).prompt_ids
    policy = generate_completions(module.policy, module.tokenizer, ids, SHORT, batch_size=2)
    assert [r["policy"] for r in callback.last_evaluation.rows] == policy
    valid = [(len(p), len(r)) for p, r in zip(policy[:5], references[:5])]
    wins = sum(a > b for a, b in valid)
    ties = sum(a == b for a, b in valid)
    assert wins + ties >= 1 and sum(a < b for a, b in valid) >= 2  # both outcomes are exercised
    low, high = wilson_interval(wins + 0.5 * ties, 5)
    lengths = [len(module.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in policy]
    ref_lengths = [len(module.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in references]
    expected = {
        "win_rate": (wins + 0.5 * ties) / 5, "win_rate_ci_low": low, "win_rate_ci_high": high,
        "tie_rate": ties / 5, "invalid_rate": 1 / 6, "num_prompts": 6, "num_valid": 5,
        "policy_length_tokens": sum(lengths) / 6, "baseline_length_tokens": sum(ref_lengths) / 6,
        "length_ratio": sum(lengths) / sum(ref_lengths),
    }
    got = callback.history[-1]
    for name, value in expected.items():
        assert math.isclose(got[f"val/judge/{name}"], value, rel_tol=1e-9, abs_tol=1e-12), (name, got)
    # the CSV logger (not TensorBoard) gets the scalars and nothing breaks without tables/figures
    csv.save()
    header = (tmp_path / "csv" / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "val/judge/win_rate" in header and "val/judge/win_rate_ci_high" in header


def test_initial_baseline_is_generated_once_and_survives_a_resume(tmp_path, monkeypatch):
    calls = []
    real = judge_eval.generate_completions

    def counting(model, *args, **kwargs):
        calls.append(model)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(judge_eval, "generate_completions", counting)
    module = SFTModule(model="tiny-random-llama", lr=1e-2, lr_scheduler="constant")
    callback = JudgeEvalCallback(LongerWins(), baseline="initial", num_prompts=3, every_n_steps=1, sampling=SHORT,
                                 on_validation_end=False)
    trainer = _trainer(tmp_path, steps=3, limit_val_batches=0, callbacks=[callback])
    trainer.fit(module, datamodule=_datamodule(limit=16))
    assert len(callback.history) == 3
    policy_calls = [m for m in calls if m is module.policy]
    baseline_calls = [m for m in calls if m is not module.policy]
    assert len(policy_calls) == 3 and len(baseline_calls) == 1  # SFTModule has no ref_model: `model` reloaded
    cached = callback.state_dict()["baseline_cache"]
    assert cached["source"] == "tiny-random-llama" and len(cached["completions"]) == 3
    # the baseline is the untrained model's greedy output: the same as a fresh load of it
    from lit_rlhf import models

    fresh = models.load_causal_lm("tiny-random-llama", module.tokenizer)
    ids = callback.eval_prompts(trainer, module).prompt_ids
    assert cached["completions"] == generate_completions(fresh, module.tokenizer, ids, SHORT)
    assert [r["baseline"] for r in callback.last_evaluation.rows] == cached["completions"]

    ckpt = tmp_path / "step3.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=False)["callbacks"]
    state = next(v for k, v in saved.items() if "JudgeEvalCallback" in k)
    assert state["baseline_cache"] == cached

    # resume: a new callback gets the cache from the checkpoint, only the policy generates
    calls.clear()
    resumed_cb = JudgeEvalCallback(LongerWins(), baseline="initial", num_prompts=3, every_n_steps=1, sampling=SHORT,
                                   on_validation_end=False)
    resumed = SFTModule(model="tiny-random-llama", lr=1e-2, lr_scheduler="constant")
    _trainer(tmp_path, steps=4, limit_val_batches=0, callbacks=[resumed_cb]).fit(
        resumed, datamodule=_datamodule(limit=16), ckpt_path=ckpt)
    assert [h["step"] for h in resumed_cb.history] == [1.0, 2.0, 3.0, 4.0]  # history came back too
    assert len(calls) == 1 and calls[0] is resumed.policy
    assert [r["baseline"] for r in resumed_cb.last_evaluation.rows] == cached["completions"]

    # a cache made for other prompts is not reused
    other = JudgeEvalCallback(LongerWins(), baseline="initial", prompts=["other prompt:"], sampling=SHORT)
    other.load_state_dict(callback.state_dict())
    calls.clear()
    other.evaluate(_trainer(tmp_path), resumed)
    assert len(calls) == 2

    # a module with a reference model (DPO): the baseline is generated by that frozen model
    from lit_rlhf.modules import DPOModule

    dpo = DPOModule(model="tiny-random-llama")
    with_ref = JudgeEvalCallback(LongerWins(), baseline="initial", prompts=["other prompt:"], sampling=SHORT)
    calls.clear()
    with_ref.evaluate(_trainer(tmp_path), dpo)
    assert calls == [dpo.policy, dpo.ref_model] and with_ref.state_dict()["baseline_cache"]["source"] == "ref_model"


def test_lora_policy_is_judged_with_its_adapter_against_its_adapter_free_base(tmp_path, monkeypatch):
    """With LoRA the policy samples with its adapter on, and the `initial` baseline is the same base
    with the adapter off: a DPO module's reference view, and for a module without a reference
    (SFT) that view too, never a second copy of the base. A policy in training mode with gradient
    checkpointing still samples with the KV cache (eval mode inside), and every adapter switch is
    as it was afterwards."""
    from lit_rlhf import models
    from lit_rlhf.models import adapters
    from lit_rlhf.modules import DPOModule

    prompts = [f"Q{i}: say something.\nA:" for i in range(4)]
    loads = []
    real_load = models.load_causal_lm
    monkeypatch.setattr(models, "load_causal_lm", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    for cls, extra in ((DPOModule, {}), (SFTModule, {"memory": Memory(gradient_checkpointing=True)})):
        torch.manual_seed(0)
        module = cls(model="tiny-random-llama", lora={"r": 4, "alpha": 8}, **extra).train()
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():  # move the adapter away from its identity start (B = 0)
            for _, param in adapters.adapter_parameters(module.policy, adapters.POLICY):
                param.add_(0.5 * torch.randn(param.shape, generator=gen))
        state = adapters._state(module.policy)
        loads.clear()
        callback = JudgeEvalCallback(LongerWins(), baseline="initial", prompts=prompts, sampling=SHORT)
        callback.evaluate(_trainer(tmp_path), module)
        assert loads == [], f"{cls.__name__}: the baseline loaded a second copy of the base"
        assert adapters._state(module.policy) == state and module.policy.training

        ids = prompts_from_texts(module.tokenizer, prompts).prompt_ids
        merged = adapters.merged_copy(module.policy, adapters.POLICY).eval()  # plain model: base + adapter
        base = real_load("tiny-random-llama", module.tokenizer).eval()
        with_adapter = generate_completions(merged, module.tokenizer, ids, SHORT)
        without = generate_completions(base, module.tokenizer, ids, SHORT)
        assert with_adapter != without  # the adapter changes what the policy says
        rows = callback.last_evaluation.rows
        assert [r["policy"] for r in rows] == with_adapter, cls.__name__
        assert [r["baseline"] for r in rows] == without, cls.__name__
        expected_source = "ref_model" if cls is DPOModule else "tiny-random-llama"
        assert callback.state_dict()["baseline_cache"]["source"] == expected_source


def test_entry_point_judges_an_exported_policy_against_references(tmp_path):
    from lit_rlhf.apps.judge_policy import main as judge_main

    policy_dir = SFTModule(model="tiny-random-llama").export_hf(tmp_path / "policy")
    judge_yaml = tmp_path / "judge.yaml"
    judge_yaml.write_text(yaml.safe_dump({"judge": {"class_path": "lit_rlhf.judges.LocalLMJudge",
                                                    "init_args": {"model_name": "tiny-random-llama"}}}))
    out = tmp_path / "out"
    metrics = judge_main([
        "--policy", str(policy_dir), "--baseline", "reference", "--prompts", "bundled:tldr_sft",
        "--split", "validation", "--judge", str(judge_yaml), "--num_prompts", "4", "--max_new_tokens", "6",
        "--batch_size", "3", "--output_dir", str(out),
    ])
    assert metrics["val/judge/num_prompts"] == 4 and metrics["val/judge/invalid_rate"] == 0.0
    assert json.loads((out / "metrics.json").read_text()) == metrics
    rows = [json.loads(line) for line in (out / "judgements.jsonl").read_text().splitlines()]
    summaries = [json.loads(line)["summary"] for line in _bundled("tldr_sft.validation.jsonl").open()][:4]
    assert [r["baseline"] for r in rows] == [" " + s for s in summaries]
    assert all(r["winner"] in ("a", "b", "tie") and r["raw"].startswith("P(A)=") for r in rows)
    wins = sum(r["winner"] == "a" for r in rows) + 0.5 * sum(r["winner"] == "tie" for r in rows)
    assert math.isclose(metrics["val/judge/win_rate"], wins / 4)
    assert (out / "win_rate_by_length_ratio.png").stat().st_size > 1000


def test_markdown_cells_escape_pipes_and_newlines():
    assert markdown_cell("a|b\nc\r\nd") == "a\\|b<br>c<br>d"
    assert markdown_cell("x" * 20, max_chars=5) == "xxxxx …"
    assert markdown_cell("a\u2028b\x0bc\rd") == "a<br>b<br>c<br>d"  # every str.splitlines break
    table = examples_table([{"prompt": "p|q", "policy": "one\ntwo", "baseline": "", "winner": "b", "raw": "",
                             "error": "bad reply"}])
    assert table.splitlines()[2] == "| 0 | p\\|q | one<br>two |  | baseline | (error: bad reply) |"


def test_bad_configuration_is_a_clear_error():
    with pytest.raises(TypeError, match="PairwiseJudge"):
        JudgeEvalCallback(judge="gpt-4")
    with pytest.raises(ValueError, match="baseline"):
        JudgeEvalCallback(LongerWins(), baseline="sft")
    module = SFTModule(model="tiny-random-llama")
    callback = JudgeEvalCallback(LongerWins(), baseline="reference", prompts=["no reference:"])
    with pytest.raises(ValueError, match="reference completion"):
        callback.eval_prompts(None, module)


def _bundled(name):
    from lit_rlhf.data.sources import BUNDLED_DIR

    return BUNDLED_DIR / name
