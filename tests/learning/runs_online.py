"""The online learning runs: build the method, measure, train ROLLOUTS rollouts with a Lightning
Trainer, measure again (the offline runs and `Measure` are in `runs.py`). The tests
(`test_online.py`, `test_online_case.py`) assert on these runs; `python -m tests.learning.measure`
reruns them over more seeds to re-derive the thresholds.
"""

from __future__ import annotations

import copy
from typing import Any

import lightning as L

from lit_rlhf.data.collate import SFTCollator
from lit_rlhf.models import load_tokenizer
from lit_rlhf.modules import (
    DAPOModule,
    DrGRPOModule,
    GRPOModule,
    GSPOModule,
    OnlineDPOModule,
    PPOModule,
    PPOPtxModule,
    ReinforcePPModule,
    RejectionSamplingModule,
    ReMaxModule,
    RLOOModule,
    XPOModule,
)
from tests.learning.case_task import CaseReward, case_prompts, expected_case_reward, kl_to_reference
from tests.learning.runs import (
    BATCH,
    EVAL_PROMPTS,
    EVAL_SAMPLES,
    HELD_OUT_ROWS,
    HELD_OUT_SEED,
    LENGTH,
    MODEL,
    TEMPERATURE,
    TRAIN_ROWS,
    Measure,
    quiet_trainer,
)
from tests.learning.tasks import (
    LetterReward,
    eos_bias,
    expected_letter_reward,
    length_rows,
    make_prompts,
    prompt_loader,
    token_nll,
)
from tests.modules.pinned import LeaveOneOutGRPO

# ROLLOUTS rollouts of PROMPTS prompts (x G generations) and LENGTH-token responses
ROLLOUTS, PROMPTS, GENERATIONS = 8, 4, 8
PPO_PROMPTS = 16

# --------------------------------------------------------------------------------------------
# online methods: the expected LetterReward (or CaseReward) on held-out prompts
# --------------------------------------------------------------------------------------------

# (module class, arguments, EOS bias). The GRPO family with the settings of their papers; every
# method gets the KL coefficient and the temperature explicitly. GRPO (0.1, DeepSeekMath's 0.04),
# RLOO and REINFORCE++ (0.03) and PPO (0.05, N+ Table 7) run at a KL coefficient whose effect
# on the KL shows within 8 rollouts on every seed (`test_online.py`'s KL test, README). The group methods sample
# PROMPTS x GENERATIONS responses per rollout, PPO (one response per prompt) PPO_PROMPTS.
ONLINE: dict[str, tuple[type, dict[str, Any], float | None]] = {
    "grpo": (GRPOModule, dict(scale="group", kl_coef=0.1, num_iterations=2), None),
    # GRPO's loss fed leave-one-out advantages (a test-only subclass: `tests.modules.pinned`)
    "grpo_rloo_advantage": (LeaveOneOutGRPO, dict(kl_coef=0.04), None),
    # Dr. GRPO (Liu et al. 2025): no std scaling, a constant normaliser instead of the length
    "dr_grpo": (DrGRPOModule, dict(kl_coef=0.0), None),
    # DAPO (Yu et al. 2025): clip-higher, dynamic sampling, token mean, overlong filtering, no KL;
    # responses end early at random (an EOS bias), so the overlong filter keeps some of them
    "dapo": (DAPOModule, dict(clip_eps_low=0.2, clip_eps_high=0.28, dynamic_sampling=True, mask_truncated=True,
                              kl_coef=0.0), 4.0),
    # GSPO (Zheng et al. 2025): sequence-level ratio with its tiny clip ranges, two passes
    "gspo": (GSPOModule, dict(clip_eps_low=3e-4, clip_eps_high=4e-4, kl_coef=0.0, num_iterations=2), None),
    "reinforce_pp": (ReinforcePPModule, dict(kl_coef=0.03), None),
    "reinforce_pp_baseline": (ReinforcePPModule, dict(baseline=True, kl_coef=0.01), None),
    "rloo": (RLOOModule, dict(kl_coef=0.03), None),
    "ppo": (PPOModule, dict(kl_coef=0.05, ppo_epochs=2, num_minibatches=1), None),
    # ReMax (Li et al. 2023): the greedy response's reward as the baseline, one sample per prompt
    # as in the paper (32 prompts: the others' 32 sampled responses per rollout, plus 32 greedy)
    "remax": (ReMaxModule, dict(kl_coef=0.01), None),
    # rejection sampling: the best of 8 per prompt, SFT on it (no KL)
    "rejection_sampling": (RejectionSamplingModule, dict(selection="per_prompt"), None),
    # online DPO (Guo et al. 2024): 2 samples per prompt annotated by the reward, beta 0.1
    "online_dpo": (OnlineDPOModule, dict(beta=0.1), None),
    # XPO (Xie et al. 2024): online DPO on a policy sample and a reference sample per prompt, plus
    # the exploration term (alpha 1e-3: 1e-5 moves nothing in 8 rollouts of 6-token responses)
    "xpo": (XPOModule, dict(beta=0.1, alpha=1e-3), None),
    # PPO-ptx (InstructGPT eq. 2): the PPO run above at kl_coef 0.01 plus gamma x the NLL of 8 SFT
    # rows a step (`tasks.LengthSFTDataModule`: digits by a rule of the prompt, drawn from the
    # run's seed); gamma 0.03: at 0.1 and more the SFT term outweighs the reward here; at kl_coef
    # 0.05 its least gain falls to 0.050 (tests/learning/README.md)
    "ppo_ptx": (PPOPtxModule, dict(kl_coef=0.01, ppo_epochs=2, num_minibatches=1, ptx_coef=0.03), None),
}

# (prompts, generations per prompt) of the methods whose rollouts are not PROMPTS x GENERATIONS
# (the same 32 sampled responses per rollout, except PPO)
ROLLOUT_SHAPE: dict[type, tuple[int, int]] = {PPOModule: (PPO_PROMPTS, 1), PPOPtxModule: (PPO_PROMPTS, 1),
                                              ReMaxModule: (32, 1), OnlineDPOModule: (16, 2),
                                              XPOModule: (16, 2)}


def run_online(name: str, seed: int, task: str = "letters", rollouts: int = ROLLOUTS, **overrides: Any) -> Measure:
    """The policy's expected reward on held-out prompts before and after ROLLOUTS rollouts: of
    `LetterReward` (`task` "letters") or of `CaseReward` without its offset ("case", the
    prompt-dependent task of `tests.learning.case_task`). Its companion: the mean NLL per
    completion token of held-out SFT rows of digits (`length_rows`), which only PPO-ptx trains on
    (PPO's is PPO-ptx's with ptx_coef 0); and the KL of the trained policy to the initial one on
    the held-out prompts. `overrides` replace the method's arguments (`kl_coef=0.0`)."""
    cls, kwargs, bias = ONLINE[name]
    kwargs = {**kwargs, **overrides}
    L.seed_everything(seed, verbose=False)
    prompts, generations = ROLLOUT_SHAPE.get(cls, (PROMPTS, GENERATIONS))
    tok = load_tokenizer(MODEL)
    extra = {} if issubclass(cls, (PPOModule, OnlineDPOModule)) else {"num_generations": generations}
    if cls is PPOPtxModule:  # TRAIN_ROWS SFT rows drawn from the run's seed, BATCH a step
        extra["ptx_data"] = {"class_path": "tests.learning.tasks.LengthSFTDataModule",
                             "init_args": {"rows": TRAIN_ROWS, "seed": seed, "batch_size": BATCH}}
    reward = CaseReward(tok, LENGTH) if task == "case" else LetterReward(tok, LENGTH)
    module = cls(model=MODEL, reward_fns=[reward], max_new_tokens=LENGTH, temperature=TEMPERATURE,
                 lr=1e-2, lr_scheduler="constant", total_episodes=rollouts * prompts * generations,
                 log_completions_every_n_steps=0, **extra, **kwargs)
    if bias is not None:
        eos_bias(module, bias)
    initial = copy.deepcopy(module.policy).requires_grad_(False)
    if task == "case":  # half the prompts in lowercase, half in uppercase
        held_out, measure = case_prompts(EVAL_PROMPTS, HELD_OUT_SEED), expected_case_reward
        train = case_prompts(2 * prompts, seed, exclude=held_out)
    else:
        held_out, measure = make_prompts(EVAL_PROMPTS, HELD_OUT_SEED), expected_letter_reward
        train = [p for p in make_prompts(2 * prompts + EVAL_PROMPTS, seed) if p not in held_out][: 2 * prompts]

    held_sft = SFTCollator(tok.pad_token_id)(length_rows(tok, HELD_OUT_ROWS, HELD_OUT_SEED))

    def expected() -> float:
        return measure(module.policy, tok, held_out, LENGTH, TEMPERATURE, EVAL_SAMPLES)

    before, nll_before = expected(), token_nll(module.policy, held_sft)
    quiet_trainer(max_epochs=-1).fit(module, prompt_loader(tok, train, prompts))
    kl = kl_to_reference(module.policy, initial, tok, held_out, LENGTH, TEMPERATURE, EVAL_SAMPLES)
    return Measure(before, expected(), nll_before, token_nll(module.policy, held_sft), kl)
