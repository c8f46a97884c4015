"""The DRO miniature's second reading (experiments/dro_single_trajectory/reading.py and the level
functions of exact.py): each measure against a value worked by hand or solved another way, and
the committed reading against the files it was computed from and the README that shows it."""

from __future__ import annotations

import json
import math

import pytest
import torch
from scipy.optimize import brentq, fsolve

from experiments.dro_single_trajectory import exact, reading
from experiments.dro_single_trajectory.measures import distance_to_optimum, regularised_objective
from experiments.readme_block import block, render_into
from tests.helpers import REPO_ROOT, decimals_not_in_files

MAIN = REPO_ROOT / "experiments" / "dro_single_trajectory" / "results" / "main"

# one prompt, two reward levels 0 < 1, the start half on each
HALF = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
LEVELS = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
VALID = torch.ones(1, 2, dtype=torch.bool)


def _kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q) if a > 0)


def test_optimum_and_the_distance_to_it_by_hand():
    # Z = (1 + e) / 2; pi* = (1, e) / (1 + e); its objective E[r] - KL is log Z (Theorem 1)
    log_z = exact.log_partition(HALF, LEVELS, VALID, tau=1.0)
    assert log_z.item() == pytest.approx(math.log((1 + math.e) / 2))
    star = exact.tilted_levels(HALF, LEVELS, VALID, 1.0)[0].tolist()
    assert star == pytest.approx([1 / (1 + math.e), math.e / (1 + math.e)])
    assert star[1] - _kl(star, [0.5, 0.5]) == pytest.approx(log_z.item())
    # pi = (0.6, 0.4): KL(pi || pi*) summed directly, against the identity log Z - J / tau
    p = [0.6, 0.4]
    direct = _kl(p, star)
    identity = exact.kl_to_optimum(torch.tensor([0.4], dtype=torch.float64), torch.tensor([_kl(p, [0.5, 0.5])], dtype=torch.float64),
                                   log_z, tau=1.0)
    assert identity.item() == pytest.approx(direct, abs=1e-12) and direct > 0.05
    # tau 2: pi* ∝ start exp(r / 2); the identity with tau
    star2 = exact.tilted_levels(HALF, LEVELS, VALID, 2.0)[0].tolist()
    assert star2 == pytest.approx([1 / (1 + math.exp(0.5)), math.exp(0.5) / (1 + math.exp(0.5))])
    log_z2 = exact.log_partition(HALF, LEVELS, VALID, tau=2.0)
    assert exact.kl_to_optimum(torch.tensor([0.4], dtype=torch.float64), torch.tensor([_kl(p, [0.5, 0.5])], dtype=torch.float64), log_z2,
                               tau=2.0).item() == pytest.approx(_kl(p, star2), abs=1e-12)


def test_objective_and_distance_of_a_saved_run_by_hand():
    run = {"expected_reward": [0.8, 0.5], "kl": [0.1, 0.0]}
    # (0.8 - 0.5) / 0.2 - 2 * 0.1 = 1.3 ; (0.5 - 0.5) / 0.2 - 0 = 0
    assert regularised_objective(run, mean=0.5, std=0.2, tau=2.0) == pytest.approx([1.3, 0.0])
    # the start itself (KL 0, E[r_norm] = 0.5 on levels 0, 1): KL(start || pi*) = log Z - 0.5
    log_z = exact.log_partition(HALF, LEVELS, VALID, tau=1.0)
    start = {"expected_reward": [0.5], "kl": [0.0]}
    star = exact.tilted_levels(HALF, LEVELS, VALID, 1.0)[0].tolist()
    assert distance_to_optimum(start, log_z, 0.0, 1.0, 1.0) == pytest.approx([_kl([0.5, 0.5], star)])


def test_frontier_by_hand():
    # beta 1: pi = (1, e) / (1 + e): reward e / (1 + e), KL(pi || start) summed by hand
    point = exact.frontier(HALF, LEVELS, VALID, torch.tensor([1.0]))[0].tolist()
    pi = [1 / (1 + math.e), math.e / (1 + math.e)]
    assert point == pytest.approx([_kl(pi, [0.5, 0.5]), math.e / (1 + math.e)])
    # and back: the point at that KL is beta 1 (raw rewards read on the levels: 10 x)
    beta, reward = exact.frontier_at_kl(HALF, LEVELS, VALID, point[0], rewards=10 * LEVELS)
    assert beta == pytest.approx(1.0, rel=1e-6) and reward == pytest.approx(10 * math.e / (1 + math.e), rel=1e-6)
    assert exact.frontier_at_kl(HALF, LEVELS, VALID, 0.0) == (math.inf, 0.5)  # KL 0: the start
    # padding (an invalid level) carries no mass
    padded = exact.frontier(torch.tensor([[0.5, 0.5, 0.0]]), torch.tensor([[0.0, 1.0, 0.0]]),
                            torch.tensor([[True, True, False]]), torch.tensor([1.0]))
    assert padded[0].tolist() == pytest.approx(point)


def test_reward_levels_follow_level_masses_order():
    rewards = torch.tensor([[0.5, 0.0, 1.0, 0.5], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    levels, valid = exact.reward_levels(rewards)
    assert levels.tolist() == [[0.0, 0.5, 1.0], [0.0, 1.0, 0.0]] and valid.tolist() == [[True] * 3, [True, True, False]]
    logp = torch.tensor([[0.1, 0.2, 0.3, 0.4]] * 2, dtype=torch.float64).log()
    masses = exact.level_masses(logp, rewards)
    assert (masses * levels).sum(-1).tolist() == pytest.approx(exact.expected_reward(logp, rewards).tolist())


def _eq8_gradient(masses, start, levels, valid, v, tau):
    """Eq. 8's expected gradient in the level logits, by autograd of the DRO loss with V held fixed."""
    logits = torch.where(valid, masses.clamp(min=1e-300).log(), torch.full_like(masses, -1e4)).requires_grad_(True)
    log_start = torch.where(valid, start.clamp(min=1e-300).log(), torch.full_like(start, -1e4))
    ratio = torch.where(valid, torch.log_softmax(logits, -1) - log_start, torch.zeros_like(start))
    (0.5 * (start * valid * (levels - v - tau * ratio) ** 2).sum()).backward()
    return logits.grad


def test_fixed_point_with_v_zero_solves_the_stationarity_equations():
    # start (1/2, 1/2), r = (0, 1), tau 1, V = 0. Eq. 8 vanishes when r_k - tau l_k = S u_k with
    # u_k = pi_k / start_k = e^{l_k} and S = E_start[r - tau l]: with u_0 + u_1 = 2,
    # -log u0 / u0 = (1 - log(2 - u0)) / (2 - u0), solved here by bracketing
    u0 = brentq(lambda u: -math.log(u) / u - (1 - math.log(2 - u)) / (2 - u), 1e-6, 1.0)
    masses, v = exact.offline_fixed_point(HALF, LEVELS, VALID, 1.0, "zero")
    assert v == 0.0 and masses[0].tolist() == pytest.approx([u0 / 2, 1 - u0 / 2], abs=1e-9)
    assert _eq8_gradient(masses, HALF, LEVELS, VALID, 0.0, 1.0).abs().max() < 1e-8
    # not pi*: with V = 0 the fixed point is another policy
    assert masses[0, 1].item() != pytest.approx(math.e / (1 + math.e), abs=1e-3)
    # V(x) at its optimum: pi* exactly, V = tau log Z
    star, v_star = exact.offline_fixed_point(HALF, LEVELS, VALID, 1.0, "per_prompt")
    assert star[0, 1].item() == pytest.approx(math.e / (1 + math.e)) and v_star == pytest.approx(math.log((1 + math.e) / 2))
    assert _eq8_gradient(star, HALF, LEVELS, VALID, v_star, 1.0).abs().max() < 1e-12
    with pytest.raises(ValueError, match="per_prompt, single or zero"):
        exact.offline_fixed_point(HALF, LEVELS, VALID, 1.0, "network")


def test_fixed_point_with_a_single_value_solves_the_joint_equations():
    # two prompts with different rewards: one V for both, V = mean_x E_start[r - tau l] at the fixed point
    start = torch.tensor([[0.5, 0.5], [0.8, 0.2]], dtype=torch.float64)
    levels = torch.tensor([[0.0, 1.0], [-1.0, 2.0]], dtype=torch.float64)
    valid = torch.ones(2, 2, dtype=torch.bool)
    masses, v = exact.offline_fixed_point(start, levels, valid, 1.0, "single")

    def equations(z):  # unknowns: u_0 of each prompt and V; u_1 from the normalisation
        u0, w0, c = z
        out = []
        for (m0, m1), (r0, r1), a in zip(start.tolist(), levels.tolist(), (u0, w0)):
            b = (1 - m0 * a) / m1
            out.append((r0 - c - math.log(a)) / a - (r1 - c - math.log(b)) / b)  # the same S on both levels
        targets = [m0 * (r0 - math.log(a)) + m1 * (r1 - math.log((1 - m0 * a) / m1))
                   for (m0, m1), (r0, r1), a in zip(start.tolist(), levels.tolist(), (u0, w0))]
        return out + [sum(targets) / 2 - c]

    u0, w0, c = fsolve(equations, [0.8, 0.9, 0.5], xtol=1e-13)
    assert max(abs(e) for e in equations([u0, w0, c])) < 1e-10
    assert v == pytest.approx(c, abs=1e-9)
    assert masses[:, 0].tolist() == pytest.approx([0.5 * u0, 0.8 * w0], abs=1e-8)
    assert _eq8_gradient(masses, start, levels, valid, v, 1.0).abs().max() < 1e-8


def _run(levels, expected):
    return {"levels": levels, "expected_reward": expected}


def test_win_rate_verdict_by_hand():
    # ours (.5, .5) against (1, 0): .75 ; (0, 1) against (.5, .5): .75 ;
    # (.25, .75) against (.5, .5): .25 * (0 + .25) + .75 * (.5 + .25) = .625
    ours = [_run([[0.5, 0.5], [0.0, 1.0]], [0.5, 1.0]), _run([[0.5, 0.5], [0.25, 0.75]], [0.5, 0.75])]
    theirs = [_run([[1.0, 0.0], [0.5, 0.5]], [0.0, 0.5]), _run([[1.0, 0.0], [0.5, 0.5]], [0.0, 0.5])]
    out = reading.win_rate_verdict(ours, theirs, num_resamples=300, seed=0)
    assert out["mean"] == pytest.approx((0.75 + 0.75 + 0.75 + 0.625) / 4)
    assert out["per_seed"] == pytest.approx([0.75, 0.6875])
    # per prompt over seeds: .75 and .6875, both above 1/2
    assert out["sign_test"] == {"positive": 2, "negative": 0, "ties": 0, "p_value": 0.5}
    assert out["low"] == pytest.approx(0.625) and out["verdict"] == "DRO-V ahead"  # every cell above 1/2
    back = reading.win_rate_verdict(theirs, ours, num_resamples=300, seed=0)
    assert back["mean"] == pytest.approx(1 - out["mean"]) and back["verdict"] == "arm ahead"
    assert reading.win_rate_verdict(ours, ours, 300, 0)["verdict"] == "no detectable difference"
    assert reading.seed_pairs_above(ours, theirs) == (0, 4) and reading.seed_pairs_above(theirs, ours) == (4, 4)
    with pytest.raises(ValueError, match="seeds against"):
        reading.win_rate_verdict(ours, theirs[:1], 10, 0)


def test_paired_difference_by_hand():
    out = reading.paired_difference([[1.0, 0.5], [0.5, 0.5]], [[0.0, 0.5]], num_resamples=300, seed=0)
    # differences (1, 0) and (0.5, 0): mean 0.375; per prompt 0.75 and 0 (a tie)
    assert out["mean"] == pytest.approx(0.375)
    assert out["sign_test"] == {"positive": 1, "negative": 0, "ties": 1, "p_value": 1.0}


# ------------------------------------------------------------------------------------------------
# the committed reading: computed from the committed files, and shown as it is in the README
# ------------------------------------------------------------------------------------------------

def _assert_close(a, b, path="reading"):
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), path
    else:
        assert a == b, path


def test_committed_reading_is_what_the_code_computes_from_the_files():
    results = json.loads((MAIN / "results.json").read_text())
    samples = json.loads((MAIN / "samples.json").read_text())
    saved = json.loads((MAIN / "reading.json").read_text())
    fresh = reading.analyse(results, samples, fixed_points=False)  # the fixed points: checked by hand above
    for key in ("arms", "optimum", "frontier"):  # equal up to float rounding on another machine
        _assert_close(json.loads(json.dumps(fresh[key])), saved[key])
    # the level-scale optimum is run.py's token-scale pi* (exact.regularised_optimum)
    assert saved["optimum"]["expected_reward"] == pytest.approx(results["optimum"]["expected_reward"], abs=1e-9)
    assert saved["fixed_points"]["per_prompt"]["expected_reward"] == pytest.approx(results["optimum"]["expected_reward"])
    assert saved["fixed_points"]["per_prompt"]["kl"] == pytest.approx(results["optimum"]["kl"], abs=1e-9)
    assert (MAIN / "reading.md").read_text() == reading.markdown(saved)


def test_readme_shows_the_committed_tables():
    readme = (REPO_ROOT / "experiments" / "README.md").read_text()
    assert block(readme, "main") == (MAIN / "reading.md").read_text()
    table = (MAIN / "results.md").read_text().split("\n\n")[0]
    assert table in readme


def _numbers_not_in_the_files(readme: str) -> list[str]:
    """The decimal numbers of the README's DRO reading (from its claims to the next section) that
    no result file of the miniature carries."""
    results = MAIN.parent
    section = readme.split("**Reading, against the paper's claims.**", 1)[1].split("### The value head", 1)[0]
    tables = [MAIN / "reading.md", MAIN / "results.md", results / "d11_head" / "results.md",
              results / "d11_head" / "value_first" / "results.md"]
    return decimals_not_in_files(section, tables, [MAIN / "results.json", MAIN / "reading.json"])


def test_every_number_of_the_readme_reading_is_in_a_result_file():
    readme = (REPO_ROOT / "experiments" / "README.md").read_text()
    assert _numbers_not_in_the_files(readme) == []
    assert _numbers_not_in_the_files(readme.replace("0.457 [0.424, 0.495], below", "0.475 [0.424, 0.495], below")) == ["0.475"]


def test_render_into_replaces_only_its_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("before\n<!-- reading:main -->\nold\n<!-- /reading:main -->\nafter\n")
    assert render_into(readme, "main", "| new |\n")
    assert readme.read_text() == "before\n<!-- reading:main -->\n| new |\n<!-- /reading:main -->\nafter\n"
    assert not render_into(readme, "main", "| new |\n")  # unchanged the second time
    with pytest.raises(ValueError, match="no block"):
        render_into(readme, "d11_head", "x")


def test_levels_are_rebuilt_only_for_the_saved_prompts():
    results = json.loads((MAIN / "results.json").read_text())
    samples = {"test_prompts": json.loads((MAIN / "samples.json").read_text())["test_prompts"]}
    levels, valid = reading.graded_levels(results, samples)
    assert levels.shape[0] == len(samples["test_prompts"]) and valid.sum(-1).max() == 10  # answers 0, 1, 8, 9: 10 levels
    samples["test_prompts"] = samples["test_prompts"][::-1]
    with pytest.raises(ValueError, match="does not give the saved held-out prompts"):
        reading.graded_levels(results, samples)
