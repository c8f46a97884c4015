"""The GRPO family as classes: each variant's pinned settings and defaults, its named steps
(`advantages`, `loss_mask`, `policy_loss`) on hand-made rollouts, its `--model.help`, and the
one-line error for an option GRPOModule handed to a variant (from Python and from the CLI)."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch

from lit_rlhf import cli
from lit_rlhf.losses import gspo_policy_loss, normalize_token_advantages, reinforce_pp_advantages
from lit_rlhf.modules import DAPOModule, DrGRPOModule, GRPOModule, GSPOModule, ReinforcePPModule
from lit_rlhf.online.moved import GRPO_MOVED as MOVED_OPTIONS
from tests.modules.pinned import LeaveOneOutGRPO
from tests.test_cli_errors import QUICK, run_lines

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY = dict(model="tiny-random-llama", num_generations=2, reward_fns=[lambda prompts, completions, **_: [0.0] * len(completions)])
VARIANTS = (GRPOModule, DrGRPOModule, DAPOModule, GSPOModule, ReinforcePPModule)

# two groups of G = 2 with rewards [1, 0] and [0.25, 0.25] (other means: a group baseline is not
# a constant shift); 3 response tokens, row 1 has 2
SCORES = torch.tensor([1.0, 0.0, 0.25, 0.25])
MASK = torch.tensor([[True, True, True], [True, True, False], [True, True, True], [True, True, True]])
HAS_EOS = torch.tensor([True, False, True, True])
OLD = torch.tensor([[-1.0, -2.0, -1.0], [-0.5, -1.0, -7.0], [-1.0, -1.0, -1.0], [-2.0, -1.0, -0.5]])
REF = torch.tensor([[-1.5, -2.0, -1.0], [-0.5, -0.5, 3.0], [-1.0, -1.5, -1.0], [-2.0, -1.0, -1.5]])


def rollout() -> SimpleNamespace:
    """What the named steps read of a Rollout."""
    return SimpleNamespace(scores=SCORES, loss_mask=MASK, response_attention_mask=MASK, has_eos=HAS_EOS, logps=OLD, ref_logps=REF)


def test_each_variant_pins_its_papers_settings():
    grpo = GRPOModule(**TINY, kl_coef=0.0)
    assert (grpo.scale, grpo.aggregation, grpo.clip_eps_low, grpo.clip_eps_high) == ("group", "token_mean", 0.2, 0.2)
    dr = DrGRPOModule(**TINY, kl_coef=0.0)  # Liu et al. 2025: no std, constant normaliser
    assert (dr.scale, dr.eps, dr.aggregation) == ("none", 0.0, "constant_normalizer")
    dapo = DAPOModule(**TINY)  # Yu et al. 2025: clip-higher 0.2 / 0.28, token mean, no KL
    assert (dapo.clip_eps_low, dapo.clip_eps_high, dapo.aggregation, dapo.kl_coef) == (0.2, 0.28, "token_mean", 0.0)
    assert dapo.dynamic_sampling and dapo.mask_truncated and dapo.max_sampling_rounds == 4
    assert not hasattr(dapo, "ref_model")  # kl_coef 0: no reference
    gspo = GSPOModule(**TINY)  # Zheng et al. 2025: 3e-4 / 4e-4, a mean over sequences
    assert (gspo.clip_eps_low, gspo.clip_eps_high, gspo.aggregation, gspo.kl_coef) == (3e-4, 4e-4, "sequence_mean", 0.0)
    assert not gspo.token_mean and dapo.token_mean
    rpp = ReinforcePPModule(**TINY)
    assert (rpp.baseline, rpp.kl_coef, rpp.aggregation, rpp.token_mean) == (False, 0.01, "token_mean", True)
    assert rpp.needs_rollout_logps and not grpo.needs_rollout_logps  # the k1 KL in the reward reads them


def test_grpo_and_dr_grpo_advantages():
    adv = GRPOModule(**TINY, kl_coef=0.0).advantages(rollout())
    # [1, 0]: mean 0.5, unbiased std sqrt(0.5), plus the class's eps 1e-4; [0.25, 0.25]: all equal, exactly 0
    scaled = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert adv.tolist() == pytest.approx([scaled, -scaled, 0.0, 0.0], rel=1e-6)
    assert (GRPOModule.eps, DrGRPOModule.eps, ReinforcePPModule.eps) == (1e-4, 0.0, 1e-8)
    assert DrGRPOModule(**TINY, kl_coef=0.0).advantages(rollout()).tolist() == [0.5, -0.5, 0.0, 0.0]  # not scaled
    # the test-only hybrid: leave-one-out, r_i - r_other
    assert LeaveOneOutGRPO(**TINY, kl_coef=0.0).advantages(rollout()).tolist() == [1.0, -1.0, 0.0, 0.0]


def test_dapo_overlong_filtering_masks_truncated_rows_only_in_the_loss():
    dapo = DAPOModule(**TINY)
    assert torch.equal(dapo.loss_mask(rollout()), MASK & HAS_EOS.unsqueeze(1))
    assert torch.equal(DAPOModule(**TINY, mask_truncated=False).loss_mask(rollout()), MASK)
    assert dapo.advantages(rollout()).tolist() == GRPOModule(**TINY, kl_coef=0.0).advantages(rollout()).tolist()


def test_gspo_policy_loss_is_the_sequence_level_one():
    gspo, grpo = GSPOModule(**TINY), GRPOModule(**TINY, kl_coef=0.0, clip_eps_low=3e-4, clip_eps_high=4e-4,
                                                aggregation="sequence_mean")
    logps = OLD + torch.tensor([[0.3, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0])
    out = gspo.policy_loss(logps, OLD, None, adv, MASK, None)
    expected = gspo_policy_loss(logps, OLD, None, adv, MASK, 3e-4, 4e-4, 0.0)
    assert out.loss.item() == expected.loss.item()
    # the sequence ratio is the geometric mean exp(0.3 / 3), not the product exp(0.3) nor GRPO's per token
    assert out.ratio_mean.item() == pytest.approx((math.exp(0.1) + 3) / 4)
    assert out.clipfrac_high.item() == 0.25  # one sequence of four clipped
    assert grpo.policy_loss(logps, OLD, None, adv, MASK, None).ratio_mean.item() != pytest.approx(out.ratio_mean.item())


@pytest.mark.parametrize("baseline", [False, True])
def test_reinforce_pp_advantages_carry_the_k1_kl_and_the_group_baseline(baseline):
    rpp = ReinforcePPModule(**TINY, kl_coef=0.5, baseline=baseline)
    adv = rpp.advantages(rollout())  # (N, R): per token
    raw = reinforce_pp_advantages(SCORES, MASK, OLD, REF, 0.5, 2 if baseline else None)
    torch.testing.assert_close(adv, normalize_token_advantages(raw, MASK, 1e-8), rtol=0, atol=0)
    other = reinforce_pp_advantages(SCORES, MASK, OLD, REF, 0.5, None if baseline else 2)
    assert not torch.allclose(adv, normalize_token_advantages(other, MASK, 1e-8))  # the baseline matters here
    # the k1 KL to go of row 0: KL = old - ref = [0.5, 0, 0] -> to go [0.5, 0, 0], times 0.5
    r0 = 0.5 if baseline else 1.0
    assert raw[0].tolist() == pytest.approx([r0 - 0.25, r0, r0])
    # the loss carries no KL term: kl_coef lives in the advantages only
    out = rpp.policy_loss(OLD.clone().requires_grad_(True), OLD, REF, adv, MASK, None)
    assert out.kl.item() == 0.0
    assert out.loss.item() == pytest.approx(-(adv[MASK].sum() / MASK.sum()).item(), abs=1e-6)


def model_help(capsys, name: str) -> str:
    with pytest.raises(SystemExit):
        cli.main(["fit", "--model.help", name])
    return capsys.readouterr().out


def argument_help(text: str, name: str) -> str:
    """The help paragraph of `--model.<name>` in `--model.help` output, on one line."""
    match = re.search(rf"^  --model\.{name}\b.*?(?=^  --|\Z)", text, re.S | re.M)
    assert match, f"--model.{name} not in the help"
    return " ".join(match.group(0).split())


ARGUMENTS = {  # listed by `--model.help`, and pinned ones not
    "GRPOModule": (["num_generations", "scale", "clip_eps_low", "clip_eps_high", "kl_coef", "aggregation",
                    "num_iterations", "num_minibatches", "temperature"], []),
    "DrGRPOModule": (["num_generations", "clip_eps_low", "clip_eps_high", "kl_coef", "num_iterations"],
                     ["scale", "eps", "aggregation"]),
    "DAPOModule": (["clip_eps_low", "clip_eps_high", "kl_coef", "dynamic_sampling", "max_sampling_rounds",
                    "mask_truncated", "scale", "num_generations"], ["aggregation"]),
    "GSPOModule": (["clip_eps_low", "clip_eps_high", "kl_coef", "scale", "num_iterations"], ["aggregation"]),
    "ReinforcePPModule": (["baseline", "kl_coef", "clip_eps_low", "clip_eps_high", "num_generations"],
                          ["scale", "eps", "aggregation"]),
}


@pytest.mark.parametrize("name", sorted(ARGUMENTS))
def test_model_help_lists_the_arguments_and_kl_coef_has_one_meaning(capsys, name):
    text = model_help(capsys, name)
    listed, pinned = ARGUMENTS[name]
    for argument in listed:
        argument_help(text, argument)
    for argument in pinned:
        assert not re.search(rf"^  --model\.{argument}\b", text, re.M), f"{name} pins {argument}"
    for moved in MOVED_OPTIONS:
        if moved not in listed:
            assert f"--model.{moved} " not in text
    kl = argument_help(text, "kl_coef")
    if name == "ReinforcePPModule":
        assert "k1 KL" in kl and "per-token reward" in kl and "never added to the loss" in kl, kl
    else:
        assert "k3 KL" in kl and "added to the loss" in kl and "reward" not in kl, kl


@pytest.mark.parametrize(("option", "value", "where"), [
    ("importance_sampling", "sequence", "use GSPOModule"),
    ("dynamic_sampling", True, "use DAPOModule"),
    ("max_sampling_rounds", 3, "use DAPOModule"),
    ("mask_truncated", True, "use DAPOModule"),
    ("advantage", "reinforce_pp", "use ReinforcePPModule"),
    ("eps", 0.0, "the class attribute `eps`"),
    ("entropy_control", {"method": "clip_cov"}, "use entropy: {covariance"),
    ("entropy_bonus", {"coef": 0.001}, "use entropy: {bonus"),
])
def test_a_moved_option_names_its_new_place_from_python(option, value, where):
    with pytest.raises(TypeError, match=rf"^GRPOModule: `{option}` moved: {where}"):
        GRPOModule(**TINY, **{option: value})
    other = GSPOModule if option != "importance_sampling" else DAPOModule  # a variant refuses it as well
    with pytest.raises(TypeError, match=rf"^{other.__name__}: `{option}` moved: {where}"):
        other(**TINY, **{option: value})


def test_a_moved_option_names_its_new_place_from_the_cli(tmp_path, capsys):
    err = run_lines(capsys, "fit", "--config", str(QUICK / "grpo.yaml"), "--model.init_args.importance_sampling",
                    "sequence")
    assert err[0] == "error: model.init_args.importance_sampling (command line) moved: use GSPOModule", err
    config = (QUICK / "grpo.yaml").read_text().replace("    scale: group\n", "    scale: group\n    dynamic_sampling: true\n")
    path = tmp_path / "old.yaml"
    path.write_text(config)
    line = config.splitlines().index("    dynamic_sampling: true") + 1
    err = run_lines(capsys, "fit", "--config", str(path))
    assert err[0] == f"error: model.init_args.dynamic_sampling ({path}, line {line}) moved: use DAPOModule", err
    # a mapping given to a former argument (jsonargparse rejects its first field) names it as well
    config = (QUICK / "grpo.yaml").read_text().replace("    scale: group\n", "    scale: group\n    entropy_bonus: {coef: 0.001}\n")
    path.write_text(config)
    line = config.splitlines().index("    entropy_bonus: {coef: 0.001}") + 1
    err = run_lines(capsys, "fit", "--config", str(path))
    assert err[0].startswith(f"error: model.init_args.entropy_bonus ({path}, line {line}) moved: use entropy: {{bonus"), err
