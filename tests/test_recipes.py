"""Every shipped recipe runs: each YAML under configs/ (and the examples run by `main.py fit`)
through the CLI, as written.

Only these overrides: the model (and the reward / value / reference / judge models) swapped to
`tiny-random-smollm2` (a tiny random Llama with SmolLM2's real tokenizer, so real text has real
token lengths), 2 optimizer steps, batch size and generation count shrunk, validation after the
last step, logging every step, outputs (logs, checkpoints, exports) in a temp dir, and the data
source of recipes on hub data (recipes on the project's bundled rows keep them): real TL;DR rows (the shared sample, `LIT_RLHF_SHARED_DATA`, default ../shared/data) and
UltraFeedback rows built here in the published schemas from real text, some of them past the
configs' length limits. The configs' length limits, precision, accumulation, clipping,
schedules and callbacks are kept. Each run must train (weights move, losses finite), validate,
and write a checkpoint and the export.

Overlays (YAMLs without a `model`) are composed with the recipe their header's usage line names
(`--config <recipe> --config <overlay>`); DeepSpeed overlays need GPUs, so on CPU their
composition is built (trainer, strategy, module) but not fitted.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import json
import logging
import math
import re
from pathlib import Path

import pytest
import torch
import yaml

from lit_rlhf import models
from lit_rlhf.cli import main

with contextlib.suppress(ImportError):  # DeepSpeed logs to stdout on first use: import it before the runs
    import deepspeed  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
TINY = models.TINY_RANDOM_SMOLLM2
STEPS = 2


def _declared(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _yamls() -> list[Path]:
    """Every config, and the examples run by `main.py` (not those driven by their own script)."""
    examples = [p for p in sorted((REPO / "examples").glob("*.yaml")) if "python main.py fit" in p.read_text()]
    return sorted(CONFIGS.rglob("*.yaml")) + examples


RECIPES = [p for p in _yamls() if _declared(p).get("model")]
OVERLAYS = [p for p in _yamls() if not _declared(p).get("model")]


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def partner_of(overlay: Path) -> Path:
    """The recipe an overlay's header composes it with (`--config <recipe> --config <overlay>`)."""
    pattern = re.compile(r"--config\s+(\S+\.yaml)\s+--config\s+" + re.escape(_name(overlay)))
    for line in overlay.read_text().splitlines():
        found = pattern.search(line)
        if found:
            return REPO / found.group(1)
    return CONFIGS / "tldr" / "sft.yaml"


# ------------------------------------------------------------------------------------------------
# data: real TL;DR rows, UltraFeedback rows in the published schemas
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tldr_rows(tldr_comparisons_sample) -> list[dict]:
    return [json.loads(line) for line in tldr_comparisons_sample.read_text().splitlines() if line.strip()]


def sft_rows(comparisons: list[dict]) -> list[dict]:
    """SFT rows (`id, subreddit, title, post, summary`) from the real comparisons: the human
    reference TL;DRs (`policy: ref`), the SFT dataset's targets."""
    out = []
    for row in comparisons:
        for s in row["summaries"]:
            if s["policy"] == "ref":
                info = row["info"]
                out.append({"id": info["id"], "subreddit": info["subreddit"], "title": info["title"],
                            "post": info["post"], "summary": s["text"].strip()})
                break
    return out


def _messages(prompt: str, answer: str) -> list[dict]:
    return [{"content": prompt, "role": "user"}, {"content": answer, "role": "assistant"}]


def ultrafeedback_texts(comparisons: list[dict]) -> list[tuple[str, list[str]]]:
    """(instruction, [answers]) from real text; the last two go past the configs' limits: a
    prompt over 512 tokens (a whole thread) and an answer over 1024 tokens."""
    posts = [r["info"]["post"] for r in comparisons]
    out = []
    for i, row in enumerate(comparisons[:6]):
        answers = [s["text"].strip() for s in row["summaries"]] + [posts[(i + 1) % len(posts)][:1500]]
        out.append((f"Summarize this post in one sentence.\n\n{row['info']['post']}", answers))
    long_answer = "\n\n".join(posts[20:32])  # ~3-4k tokens
    out.insert(2, ("Rewrite these posts as one story.", [long_answer, posts[33], posts[34][:200]]))
    out.append(("Summarize these posts.\n\n" + "\n\n".join(posts[40:46]), [posts[47], posts[48]]))
    return out


def binarized_rows(texts) -> list[dict]:
    """HuggingFaceH4/ultrafeedback_binarized: prompt, prompt_id, chosen/rejected conversations,
    score_chosen/score_rejected, messages."""
    rows = []
    for i, (prompt, answers) in enumerate(texts):
        chosen, rejected = answers[0], answers[1]
        rows.append({"prompt": prompt, "prompt_id": f"{i:064x}", "chosen": _messages(prompt, chosen),
                     "rejected": _messages(prompt, rejected), "messages": _messages(prompt, chosen),
                     "score_chosen": 8.0 - i % 3, "score_rejected": 4.0 + i % 2})
    return rows


def openbmb_rows(texts) -> list[dict]:
    """openbmb/UltraFeedback: instruction, models, completions with annotations and scores."""
    rows = []
    for i, (prompt, answers) in enumerate(texts):
        completions = []
        for j, answer in enumerate(answers):
            rating = str(1 + (i + j) % 5)
            aspect = {"Rating": rating, "Rationale": f"rated {rating}"}
            completions.append({
                "model": f"model-{j}", "response": answer, "overall_score": float(1 + (3 * i + 7 * j) % 10),
                "fine-grained_score": float(rating), "custom_system_prompt": "", "principle": "helpfulness",
                "critique": "", "annotations": {
                    "helpfulness": {**aspect, "Type": ["1"], "Rationale For Rating": f"rated {rating}"},
                    "honesty": aspect, "instruction_following": aspect,
                    "truthfulness": {**aspect, "Type": ["0"], "Rationale For Rating": f"rated {rating}"},
                },
            })
        rows.append({"source": "evol_instruct", "instruction": prompt, "models": [c["model"] for c in completions],
                     "completions": completions, "correct_answers": ["None"], "incorrect_answers": ["None"]})
    return rows


def write_splits(directory: Path, rows: list[dict], n_val: int = 2) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", rows[n_val:]), ("validation", rows[:n_val]), ("test", rows[:n_val])):
        with open(directory / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in part)
    return directory


@pytest.fixture(scope="module")
def data_dirs(tmp_path_factory, tldr_rows) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("recipe_data")
    texts = ultrafeedback_texts(tldr_rows)
    return {
        "sft": write_splits(root / "tldr_sft", sft_rows(tldr_rows)[:8]),
        "comparisons": write_splits(root / "tldr_comparisons", tldr_rows[:8]),
        "binarized": write_splits(root / "ultrafeedback_binarized", binarized_rows(texts)),
        "openbmb": write_splits(root / "ultrafeedback", openbmb_rows(texts)),
    }


DATA_KIND = {
    "TLDRSFTDataModule": "sft", "TLDRPromptDataModule": "sft", "TLDRPreferenceDataModule": "comparisons",
    "UltraFeedbackPreferenceDataModule": "binarized", "UltraFeedbackPromptDataModule": "binarized",
    "UltraFeedbackSingleDataModule": "openbmb", "UltraFeedbackListDataModule": "openbmb",
    "QADataModule": None,  # only bundled / hub question-answer data: see `_data_args`
    "DemonstrationDataModule": None,  # question-answer data played as episodes (lit_rlhf.envs.demonstrations)
}


# ------------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------------


def _outputs_to(value, out: Path):
    """Every `outputs/...` path of the config moved under `out`."""
    if isinstance(value, dict):
        return {k: _outputs_to(v, out) for k, v in value.items()}
    if isinstance(value, list):
        return [_outputs_to(v, out) for v in value]
    if isinstance(value, str) and value.startswith("outputs/"):
        return str(out / value)
    return value


def overridden_config(config: dict, out: Path, data_dirs: dict[str, Path]) -> dict:
    """The config with only the overrides the module docstring lists."""
    config = _outputs_to(copy.deepcopy(config), out)
    lora = (config.get("model", {}).get("init_args") or {}).get("lora") or {}
    if "layers_to_transform" in (lora.get("init_args") or {}):  # the tiny model has 2 blocks: its top one
        lora["init_args"]["layers_to_transform"] = [1]
    trainer = config.setdefault("trainer", {})
    logger = trainer.get("logger")
    if isinstance(logger, dict):
        logger.setdefault("init_args", {})["save_dir"] = str(out / "logs")
    for cb in trainer.get("callbacks") or []:
        args = cb.setdefault("init_args", {})
        if cb["class_path"].endswith("ModelCheckpoint"):
            args["dirpath"] = str(out / "checkpoints")
            if args.get("every_n_train_steps"):
                args["every_n_train_steps"] = STEPS
        if cb["class_path"].endswith("RewardNormalizationCallback"):
            if str(args.get("path", "")).startswith("bundled:"):  # the project's own rows, as written
                args.update(batch_size=2)
            else:
                args.update(path=str(data_dirs["sft"]), split="train", batch_size=2)
        if cb["class_path"].endswith("JudgeEvalCallback"):
            args["num_prompts"] = 2
            judge = args.get("judge", {}).get("init_args", {})
            if "model_name" in judge:
                judge["model_name"] = TINY
    ptx = ((config.get("model", {}).get("init_args") or {}).get("ptx_data") or {}).get("init_args")
    if ptx is not None:  # PPO-ptx's SFT rows: the real TL;DR rows (bundled ones as written), 2 a step
        if not str(ptx.get("path", "")).startswith("bundled:"):
            ptx.update(path=str(data_dirs["sft"]), name=None, train_split="train")
        ptx["batch_size"] = 2
    for fn in (config.get("model", {}).get("init_args") or {}).get("reward_fns") or []:  # a judge as the reward
        judge = (fn.get("init_args", {}).get("judge") or {}).get("init_args", {}) if isinstance(fn, dict) else {}
        if "model_name" in judge:
            judge["model_name"] = TINY
        scorer = (judge.get("scorer") or {}).get("init_args", {})  # a rubric judge's scorer
        if "model_name" in scorer:
            scorer["model_name"] = TINY
    return config


def _data_args(config: dict, data_dirs: dict[str, Path], batch_size: int) -> list[str]:
    from importlib import import_module

    data = config["data"]
    module, cls_name = data["class_path"].rsplit(".", 1)
    kind = DATA_KIND[cls_name]
    declared = data.get("init_args") or {}
    defaults = inspect.signature(getattr(import_module(module), cls_name).__init__).parameters
    args = [f"--data.init_args.batch_size={batch_size}", f"--data.init_args.eval_batch_size={batch_size}"]
    if str(declared.get("path", "")).startswith("bundled:keyfact_chat"):  # ~330 byte-level tokens a post
        args += ["--data.init_args.max_prompt_length=512"]
        if "max_completion_length" in defaults:
            args += ["--data.init_args.max_completion_length=160", "--data.init_args.truncate_completions=true"]
    if kind is None or str(declared.get("path", "")).startswith("bundled:"):
        return args  # a recipe on the project's bundled rows runs on them, splits as written
    args += [f"--data.init_args.path={data_dirs[kind]}", "--data.init_args.name=null"]
    for role, file_split in (("train_split", "train"), ("val_split", "validation"), ("test_split", "test")):
        split = declared.get(role, defaults[role].default if role in defaults else None)
        assert role != "val_split" or split, f"{cls_name}: the recipe configures no validation split"
        args.append(f"--data.init_args.{role}={file_split if split else 'null'}")
    return args


MAX_NEW_TOKENS = 64  # the longest generation a recipe runs with here


def _model_args(config: dict) -> list[str]:
    declared = config["model"].get("init_args") or {}
    args = [f"--model.init_args.model={TINY}"]
    for key in ("reward_model", "value_model", "ref_model", "teacher"):
        if declared.get(key) not in (None, "shared", "base"):  # `base`: the policy's own weights
            args.append(f"--model.init_args.{key}={TINY}")
    if "num_generations" in declared:
        args.append("--model.init_args.num_generations=2")
    if "total_episodes" in declared:
        args.append("--model.init_args.total_episodes=null")  # trainer.max_steps decides
    if (declared.get("max_new_tokens") or 0) > MAX_NEW_TOKENS:
        # the random tiny model seldom samples EOS: a 512-token recipe would generate 512 tokens
        # per row for minutes while testing nothing the shorter run does not
        args.append(f"--model.init_args.max_new_tokens={MAX_NEW_TOKENS}")
    return args


def _is_online(class_path: str) -> bool:
    from importlib import import_module

    from lit_rlhf.modules.online import OnlineModule

    module, name = class_path.rsplit(".", 1)
    return issubclass(getattr(import_module(module), name), OnlineModule)


def _is_ppo(class_path: str) -> bool:
    from importlib import import_module

    from lit_rlhf.modules import PPOModule

    module, name = class_path.rsplit(".", 1)
    return issubclass(getattr(import_module(module), name), PPOModule)


def run_recipe(recipe: Path, tmp_path: Path, data_dirs, overlay: Path | None = None, run: bool = True,
               extra_args: tuple[str, ...] = (), default_callbacks=None):
    config = _declared(recipe)
    accumulate = int(config.get("trainer", {}).get("accumulate_grad_batches", 1) or 1)
    declared = config["model"].get("init_args") or {}
    # validate once, after the last optimizer step; with accumulation the tiny data's epochs end
    # mid-window (Lightning then steps early), so validate after every batch there
    batches = STEPS if accumulate == 1 else 1
    online = _is_online(config["model"]["class_path"])
    if _is_ppo(config["model"]["class_path"]):  # one rollout = ppo_epochs x num_minibatches steps
        batches = math.ceil(STEPS / (declared.get("ppo_epochs", 4) * declared.get("num_minibatches", 1)))
    elif online:  # GRPO, rejection sampling: num_iterations x num_minibatches steps per rollout (RLOO, ReMax: 1)
        batches = math.ceil(STEPS / (declared.get("num_iterations", 1) * declared.get("num_minibatches", 1)))
    files = [overridden_config(config, tmp_path, data_dirs)]
    if overlay is not None:
        files.append(overridden_config(_declared(overlay), tmp_path, data_dirs))
    args = ["fit"] if run else []
    for i, content in enumerate(files):
        path = tmp_path / f"config{i}.yaml"
        path.write_text(yaml.safe_dump(content, sort_keys=False))
        args += ["--config", str(path)]
    args += [
        "--trainer.accelerator=cpu", "--trainer.devices=1", f"--trainer.max_steps={STEPS}", "--trainer.max_epochs=-1",
        "--trainer.check_val_every_n_epoch=null", f"--trainer.val_check_interval={batches}",
        "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0", "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path}",
        # online: 1 prompt per rollout (x num_generations); offline: 2 rows (KTO's z0 needs 2)
        *_model_args(config), *_data_args(config, data_dirs, 1 if online else 2), *extra_args,
    ]
    torch.manual_seed(0)
    return main(args, run=run, default_callbacks=default_callbacks)


@functools.cache
def _fresh_tiny() -> tuple[dict, dict]:
    """The tiny model's initial weights (a fixed seed: the same for every recipe), loaded once:
    (causal LM state dict, backbone state dict); read only."""
    tokenizer = models.load_tokenizer(TINY)
    fresh = models.load_causal_lm(TINY, tokenizer)
    return fresh.state_dict(), models.backbone_of(fresh).state_dict()


def trained_and_initial(module) -> tuple[dict, dict]:
    if getattr(module, "lora_config", None) is not None:  # LoRA: the trained adapters' B, which start at 0
        peft_model = getattr(module, "reward_peft", None) or module.policy
        trained = {n: p.detach() for n, p in peft_model.named_parameters() if p.requires_grad and "lora_B" in n}
        return trained, {n: torch.zeros_like(p) for n, p in trained.items()}
    from lit_rlhf.training.sharding import full_state_dict  # whole tensors under FSDP2, else state_dict()

    lm, backbone = _fresh_tiny()
    if hasattr(module, "policy"):
        return full_state_dict(module.policy), lm
    return full_state_dict(module.reward_model.backbone), backbone


def assert_trained(cli, tmp_path: Path) -> None:
    module, trainer = cli.model, cli.trainer
    assert trainer.global_step >= STEPS, trainer.global_step
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    losses = {k: v for k, v in metrics.items() if k.startswith("train/") and "loss" in k}
    no_signal = (metrics.get("train/advantages/abs_mean") == 0.0 or metrics.get("train/rewards/kept_fraction") == 0.0
                 or metrics.get("train/pairs/tie_fraction") == 1.0 or metrics.get("train/rewards/tie_fraction") == 1.0)
    # GRPO/RLOO/ReMax/online DPO with the EOS trick's `replace`: a random policy never ends its
    # response, every response (and ReMax's greedy baseline) scores the same, every advantage is
    # exactly 0, no sample beats the greedy one (examples/beat_greedy.py keeps none), every
    # online DPO pair is a tie (left out: no loss is computed at all) and every REBEL pair's reward
    # difference is 0 (examples/rebel.py regresses onto 0): no signal, by design (D23)
    dead = metrics.get("train/response/eos_fraction") == 0.0 and no_signal
    # distillation from a teacher swapped to the student's own model (the tiny one, `_model_args`):
    # the teacher's log-probs are the student's, exactly, and there is nothing to distil
    dead = dead or metrics.get("train/distill/reverse_kl") == 0.0
    assert (losses or dead) and all(math.isfinite(v) for v in losses.values()), losses
    assert any(k.startswith("val/") for k in metrics), f"no validation metric in {sorted(metrics)}"
    trained, initial = trained_and_initial(module)
    if dead:
        return _assert_outputs(module, tmp_path)
    moved = [k for k, v in trained.items() if k in initial and not torch.equal(v.float(), initial[k].float())]
    assert len(moved) >= len(trained) // 2, f"only {len(moved)} of {len(trained)} tensors moved"
    _assert_outputs(module, tmp_path)


def _assert_outputs(module, tmp_path: Path) -> None:
    assert list(tmp_path.rglob("*.ckpt")), "no checkpoint written"
    export_dir = module.hparams.get("export_dir")
    assert export_dir, "the recipe sets no export_dir"
    assert (Path(export_dir) / "config.json").is_file(), f"no export in {export_dir}"


@pytest.mark.parametrize("recipe", RECIPES, ids=_name)
def test_recipe_runs(recipe, tmp_path, data_dirs):
    torch.set_num_threads(2)
    cli = run_recipe(recipe, tmp_path, data_dirs)
    assert_trained(cli, tmp_path)


@pytest.mark.parametrize("recipe", [CONFIGS / "tldr" / "sft.yaml", CONFIGS / "quickstart" / "grpo.yaml"], ids=_name)
def test_recipe_runs_without_a_logger(recipe, tmp_path, data_dirs, caplog):
    """`--trainer.logger false`, with the console's default callbacks as main.py adds them: the
    run trains, checkpoints and exports. A callback with nothing to write to (the learning-rate
    monitor of the TL;DR recipes) says so in one line instead of refusing the run."""
    from callbacks import default_callbacks

    torch.set_num_threads(2)
    with caplog.at_level(logging.WARNING):
        cli = run_recipe(recipe, tmp_path, data_dirs, extra_args=("--trainer.logger=false",),
                         default_callbacks=default_callbacks)
    assert cli.trainer.logger is None
    assert_trained(cli, tmp_path)
    monitors = "LearningRateMonitor" in recipe.read_text()
    assert sum("has no logger" in r.getMessage() for r in caplog.records) == int(monitors)


# the LoRA step: the *_lora.yaml recipes (DPO, GRPO, PPO, reward) run above as they are; every
# other method runs its quickstart recipe again with a small LoRA config
LORA_METHODS_WITH_RECIPE = {_declared(p)["model"]["class_path"] for p in RECIPES if "lora" in p.name}
# trained with LoRA, adapter by adapter, in tests/lora/test_lora_new_methods.py
LORA_METHODS_TESTED_APART = {"lit_rlhf.modules.ReMaxModule", "lit_rlhf.modules.RejectionSamplingModule",
                             "lit_rlhf.modules.OnlineDPOModule", "lit_rlhf.modules.PPOPtxModule"}
LORA_STEP = [p for p in sorted((CONFIGS / "quickstart").glob("*.yaml"))
             if _declared(p).get("model")
             and _declared(p)["model"]["class_path"] not in LORA_METHODS_WITH_RECIPE | LORA_METHODS_TESTED_APART]


@pytest.mark.parametrize("recipe", LORA_STEP, ids=_name)
def test_recipe_runs_with_lora(recipe, tmp_path, data_dirs):
    torch.set_num_threads(2)
    cli = run_recipe(recipe, tmp_path, data_dirs, extra_args=("--model.init_args.lora={r: 4, alpha: 8}",))
    assert cli.model.lora_config is not None and cli.model.lora_config.r == 4
    assert_trained(cli, tmp_path)


@pytest.mark.parametrize("overlay", OVERLAYS, ids=_name)
def test_overlay_runs_with_its_recipe(overlay, tmp_path, data_dirs):
    torch.set_num_threads(2)
    recipe = partner_of(overlay)
    strategy = (_declared(overlay).get("trainer") or {}).get("strategy") or {}
    if "DeepSpeed" in str(strategy.get("class_path", "")):
        # DeepSpeed refuses a CPU accelerator: build the composition (strategy, module, data) only
        cli = run_recipe(recipe, tmp_path, data_dirs, overlay, run=False)
        assert type(cli.trainer.strategy).__name__ == "DeepSpeedStrategy"
        assert cli.trainer.strategy.config["zero_optimization"]["stage"] == strategy["init_args"]["stage"]
        return
    cli = run_recipe(recipe, tmp_path, data_dirs, overlay)
    assert_trained(cli, tmp_path)
