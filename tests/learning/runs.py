"""One learning run per method: build the module, measure, train a few steps with a Lightning
Trainer, measure again. The tests (`test_offline.py`, `test_online.py`) assert on these runs;
`python -m tests.learning.measure` reruns them over more seeds to re-derive the thresholds.

Every method trains on the tiny random model (`tests.learning.tasks`) with `lr_scheduler:
constant` and the temperature and KL coefficient given explicitly, so a change of a module's
defaults does not change what is measured.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_rlhf.data.collate import PreferenceCollator, SFTCollator, SingleCollator
from lit_rlhf.losses import log_odds
from lit_rlhf.modules import (
    DPOModule,
    DROVModule,
    KTOModule,
    ORPOModule,
    RewardModule,
    SFTModule,
)
from lit_rlhf.types import split_pair
from tests.learning.tasks import (
    expected_letter_reward,
    labelled_rows,
    make_prompts,
    preference_rows,
    scored_rows,
    sequence_logps,
    sft_rows,
)

MODEL = "tiny-random-llama"
HELD_OUT_SEED = 1000  # the held-out rows and prompts; training rows come from the run's seed
HELD_OUT_ROWS = 32

# offline: optimizer steps of BATCH rows each over TRAIN_ROWS rows (one epoch at 8 steps)
STEPS, BATCH, TRAIN_ROWS = 8, 8, 64

# the policy's own responses: LENGTH tokens at TEMPERATURE, EVAL_SAMPLES per held-out prompt
LENGTH, TEMPERATURE, EVAL_PROMPTS, EVAL_SAMPLES = 8, 1.0, 8, 32


@dataclass(frozen=True)
class Measure:
    """A progress measure before and after training (`value`), and its companion (`extra`:
    an accuracy, a correlation; None when the measure has none)."""

    before: float
    after: float
    extra_before: float | None = None
    extra_after: float | None = None
    kl_after: float | None = None  # online: KL(policy || initial policy) per held-out response
    generated_before: float | None = None  # offline preference methods: `letter_share`
    generated_after: float | None = None

    @property
    def gain(self) -> float:
        return self.after - self.before


def quiet_trainer(**kwargs: Any) -> L.Trainer:
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, **kwargs)


def fit_offline(module, rows, collate) -> None:
    loader = DataLoader(rows, batch_size=BATCH, shuffle=True, collate_fn=collate, drop_last=True)
    quiet_trainer(max_steps=STEPS).fit(module, loader)


# --------------------------------------------------------------------------------------------
# offline methods: held-out rows whose true ordering is known
# --------------------------------------------------------------------------------------------


def logratio_margin(module, batch) -> tuple[float, float]:
    """Held-out pairs: mean (chosen - rejected) of log(pi/pi_ref) (the implicit reward over
    beta), and the share of pairs where it is positive."""
    policy = sequence_logps(module.policy, batch.input_ids, batch.attention_mask, batch.loss_mask)
    ref = sequence_logps(module.ref_model, batch.input_ids, batch.attention_mask, batch.loss_mask)
    chosen, rejected = split_pair(policy - ref)
    margin = chosen - rejected
    return float(margin.mean()), float((margin > 0).float().mean())


def letter_share(module) -> float:
    """The share of letters among the policy's own sampled response tokens on held-out prompts
    (`tasks.expected_letter_reward`, LENGTH tokens at TEMPERATURE): how often the policy
    generates the preferred kind of completion. No offline loss pushes it directly: they push
    log-probs of the given completions, and this measures fresh ones."""
    prompts = make_prompts(EVAL_PROMPTS, HELD_OUT_SEED)  # prompts of held-out pairs, never trained on
    return expected_letter_reward(module.policy, module.tokenizer, prompts, LENGTH, TEMPERATURE, EVAL_SAMPLES)


def run_sft(seed: int, **kwargs: Any) -> Measure:
    """Held-out mean log-prob per completion token of the rule-following completions."""
    L.seed_everything(seed, verbose=False)
    module = SFTModule(model=MODEL, lr=1e-2, lr_scheduler="constant", **kwargs)
    tok = module.tokenizer
    collate = SFTCollator(tok.pad_token_id)
    held = collate(sft_rows(tok, HELD_OUT_ROWS, HELD_OUT_SEED))

    def token_logp() -> float:
        return float(sequence_logps(module.policy, held.input_ids, held.attention_mask, held.loss_mask).sum()
                     / held.loss_mask[:, 1:].sum())

    before = token_logp()
    fit_offline(module, sft_rows(tok, TRAIN_ROWS, seed), collate)
    return Measure(before, token_logp())


def run_reward(seed: int, **kwargs: Any) -> Measure:
    """Held-out pairs: mean reward margin (chosen - rejected), and accuracy."""
    L.seed_everything(seed, verbose=False)
    module = RewardModule(model=MODEL, lr=1e-3, lr_scheduler="constant", **kwargs)
    tok = module.tokenizer
    collate = PreferenceCollator(tok.pad_token_id)
    held = collate(preference_rows(tok, HELD_OUT_ROWS, HELD_OUT_SEED))

    @torch.no_grad()
    def margin() -> tuple[float, float]:
        module.eval()
        chosen, rejected = module.pair_rewards(held)
        module.train()
        return float((chosen - rejected).mean()), float((chosen > rejected).float().mean())

    (before, acc_before) = margin()
    fit_offline(module, preference_rows(tok, TRAIN_ROWS, seed), collate)
    after, acc_after = margin()
    return Measure(before, after, acc_before, acc_after)


def run_dpo(seed: int, loss_type: str = "sigmoid", beta: float = 0.1, steps: int | None = None, **kwargs: Any) -> Measure:
    """Held-out pairs: mean log-ratio margin (chosen - rejected), and accuracy."""
    L.seed_everything(seed, verbose=False)
    module = DPOModule(model=MODEL, beta=beta, loss_type=loss_type, lr=1e-3, lr_scheduler="constant", **kwargs)
    tok = module.tokenizer
    collate = PreferenceCollator(tok.pad_token_id)
    held = collate(preference_rows(tok, HELD_OUT_ROWS, HELD_OUT_SEED))
    (before, acc_before), share_before = logratio_margin(module, held), letter_share(module)
    rows = preference_rows(tok, TRAIN_ROWS, seed)
    loader = DataLoader(rows, batch_size=BATCH, shuffle=True, collate_fn=collate, drop_last=True)
    quiet_trainer(max_steps=steps or STEPS).fit(module, loader)
    after, acc_after = logratio_margin(module, held)
    return Measure(before, after, acc_before, acc_after, generated_before=share_before,
                   generated_after=letter_share(module))


def run_orpo(seed: int, odds_ratio_coef: float = 0.1, **kwargs: Any) -> Measure:
    """Held-out pairs: mean log odds ratio of the per-token mean probabilities, chosen over
    rejected (ORPO eq. 5; no reference model), and the share of pairs where it is positive."""
    L.seed_everything(seed, verbose=False)
    module = ORPOModule(model=MODEL, odds_ratio_coef=odds_ratio_coef, lr=1e-3, lr_scheduler="constant", **kwargs)
    tok = module.tokenizer
    collate = PreferenceCollator(tok.pad_token_id)
    held = collate(preference_rows(tok, HELD_OUT_ROWS, HELD_OUT_SEED))

    def margin() -> tuple[float, float]:
        sums = sequence_logps(module.policy, held.input_ids, held.attention_mask, held.loss_mask)  # (2B,)
        chosen, rejected = split_pair(log_odds(sums / held.loss_mask.sum(dim=1)))
        ratio = chosen - rejected
        return float(ratio.mean()), float((ratio > 0).float().mean())

    (before, acc_before), share_before = margin(), letter_share(module)
    fit_offline(module, preference_rows(tok, TRAIN_ROWS, seed), collate)
    after, acc_after = margin()
    return Measure(before, after, acc_before, acc_after, generated_before=share_before,
                   generated_after=letter_share(module))


def run_kto(seed: int, **kwargs: Any) -> Measure:
    """Held-out unpaired rows: mean log(pi/pi_ref) of the desirable minus the undesirable ones."""
    L.seed_everything(seed, verbose=False)
    module = KTOModule(model=MODEL, beta=0.1, lr=1e-3, lr_scheduler="constant", **kwargs)
    tok = module.tokenizer
    collate = SingleCollator(tok.pad_token_id, with_labels=True)
    held = collate(labelled_rows(tok, HELD_OUT_ROWS, HELD_OUT_SEED))

    def margin() -> float:
        policy = sequence_logps(module.policy, held.input_ids, held.attention_mask, held.loss_mask)
        ref = sequence_logps(module.ref_model, held.input_ids, held.attention_mask, held.loss_mask)
        ratio = policy - ref
        return float(ratio[held.labels].mean() - ratio[~held.labels].mean())

    before, share_before = margin(), letter_share(module)
    fit_offline(module, labelled_rows(tok, TRAIN_ROWS, seed), collate)
    return Measure(before, margin(), generated_before=share_before, generated_after=letter_share(module))


def run_drov(seed: int, tau: float = 1.0, **kwargs: Any) -> Measure:
    """Held-out single trajectories: the least-squares slope of log(pi/pi_ref) on the normalised
    reward (DRO's optimum, tau * log(pi/pi_ref) = r - V(x), has slope 1 / tau), and the
    correlation of the two."""
    L.seed_everything(seed, verbose=False)
    module = DROVModule(model=MODEL, tau=tau, lr=1e-3, value_lr=1e-3, lr_scheduler="constant", **kwargs)
    tok = module.tokenizer
    rows = scored_rows(tok, TRAIN_ROWS, seed)
    rewards = torch.tensor([row["_reward"] for row in rows], dtype=torch.float64)
    collate = SingleCollator(tok.pad_token_id, reward_mean=float(rewards.mean()), reward_std=float(rewards.std()))
    held = collate(scored_rows(tok, HELD_OUT_ROWS, HELD_OUT_SEED))

    def slope() -> tuple[float, float]:
        policy = sequence_logps(module.policy, held.input_ids, held.attention_mask, held.loss_mask)
        ref = sequence_logps(module.ref_model, held.input_ids, held.attention_mask, held.loss_mask)
        x = held.rewards.double() - held.rewards.double().mean()
        y = (policy - ref).double()
        y = y - y.mean()
        correlation = float((x * y).sum() / ((x * x).sum() * (y * y).sum()).sqrt()) if bool((y != 0).any()) else 0.0
        return float((x * y).sum() / (x * x).sum()), correlation

    before, corr_before = slope()
    fit_offline(module, rows, collate)
    after, corr_after = slope()
    return Measure(before, after, corr_before, corr_after)


OFFLINE: dict[str, Callable[[int], Measure]] = {
    "sft": run_sft,
    "reward": run_reward,
    "dpo": lambda seed: run_dpo(seed, "sigmoid"),
    "ipo": lambda seed: run_dpo(seed, "ipo"),
    "hinge": lambda seed: run_dpo(seed, "hinge"),
    "exponential": lambda seed: run_dpo(seed, "exponential"),
    "savage": lambda seed: run_dpo(seed, "savage"),
    # lambda 1, not the paper's 0.1: at 0.1 the NLL term alone separates these pairs, and the
    # test could not tell a broken odds-ratio term (tests/learning/README.md)
    "orpo": lambda seed: run_orpo(seed, odds_ratio_coef=1.0),
    "kto": run_kto,
    "drov": run_drov,
}
