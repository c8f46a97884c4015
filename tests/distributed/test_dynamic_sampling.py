"""DAPO dynamic sampling with 2 CPU processes (DDP, gloo): ranks stay in lockstep.

One subprocess run (tests/distributed/run_dynamic_sampling.py, hard timeout: a rank that samples
one round more than its peer would hang in the next collective) fits GRPO with dynamic sampling
where rank 0 needs more sampling rounds than rank 1; here we check every rank's records against
the rules of `lit_rlhf.online.dynamic_sampling`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.launch import launch
from tests.distributed.run_dynamic_sampling import GROUP, MAX_ROUNDS, PROMPTS_PER_RANK

SCRIPT = Path(__file__).with_name("run_dynamic_sampling.py")


def groups(prompts: list[str], scores: list[float]) -> list[tuple[str, tuple[float, ...], bool]]:
    """(prompt, scores, informative) per group of G contiguous rows."""
    out = []
    for start in range(0, len(scores), GROUP):
        block = tuple(scores[start: start + GROUP])
        assert len(set(prompts[start: start + GROUP])) == 1  # a prompt's G copies are contiguous
        out.append((prompts[start], block, len(set(block)) > 1))
    return out


def expected_rounds(ranks_steps: list[dict]) -> int:
    """Rounds every rank must sample: until all ranks hold B informative groups, at most MAX_ROUNDS."""
    kept = [0] * len(ranks_steps)
    for n in range(1, MAX_ROUNDS + 1):
        for r, step in enumerate(ranks_steps):
            round_ = step["rounds"][n - 1]
            kept[r] += sum(info for _, _, info in groups(round_["prompts"], round_["scores"]))
        if min(kept) >= PROMPTS_PER_RANK:
            return n
    return MAX_ROUNDS


def expected_batch(step: dict) -> list[tuple[str, tuple[float, ...], bool]]:
    """The documented batch: the first B informative groups in sampling order, topped up with the
    dropped groups in sampling order."""
    every = [g for round_ in step["rounds"] for g in groups(round_["prompts"], round_["scores"])]
    return ([g for g in every if g[2]] + [g for g in every if not g[2]])[:PROMPTS_PER_RANK]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return launch(SCRIPT, [], 2, tmp_path_factory.mktemp("dynamic"), timeout=300)


@pytest.mark.parametrize("mode, rounds", [("never", [MAX_ROUNDS, MAX_ROUNDS]), ("alternate", [2, 2])])
def test_ranks_sample_the_same_rounds_and_fill_the_batch_as_documented(results, mode, rounds):
    runs = [rank_results[mode] for rank_results in results]
    for step in range(2):
        steps = [run["steps"][step] for run in runs]
        # lockstep: every rank sampled as many rounds as the rank that needed the most
        assert [len(s["rounds"]) for s in steps] == [rounds[step]] * 2 == [expected_rounds(steps)] * 2
        for rank, (run, s) in enumerate(zip(runs, steps)):
            assert s["rows"] == PROMPTS_PER_RANK * GROUP
            batch = groups(s["trained_prompts"], s["trained_scores"])
            assert batch == expected_batch(s)
            informative = sum(g[2] for g in batch)
            stats = run["stats"][step]
            assert stats["rounds"] == len(s["rounds"])
            assert stats["informative_groups"] >= informative
            assert stats["filled_groups"] == PROMPTS_PER_RANK - informative
            assert stats["rollouts_per_step"] == len(s["rounds"])
            if rank == 1:  # always informative: its first round's groups are its batch
                assert informative == PROMPTS_PER_RANK
                assert batch == groups(s["rounds"][0]["prompts"], s["rounds"][0]["scores"])
        if mode == "never":  # rank 0 found nothing: its batch is its first round, all zero-advantage
            assert sum(g[2] for g in groups(steps[0]["trained_prompts"], steps[0]["trained_scores"])) == 0
            assert steps[0]["trained_prompts"] == steps[0]["rounds"][0]["prompts"]
    # every generated response is an episode (all ranks); the refill stream advanced once per extra round
    total_rounds = sum(rounds)
    for run in runs:
        assert run["episodes"] == total_rounds * PROMPTS_PER_RANK * GROUP * 2
        assert run["refill_batches"] == total_rounds - 2
        assert run["global_step"] == 2
    assert runs[0]["fingerprint"] == runs[1]["fingerprint"]  # gradients were reduced: same weights


def test_refill_prompts_differ_between_ranks(results):
    # rank r reads rows [r*B, (r+1)*B) of the refill permutation: no prompt is sampled twice in a round
    for step in range(2):
        refills = [rank_results["never"]["steps"][step]["rounds"][1]["prompts"] for rank_results in results]
        assert not set(refills[0]) & set(refills[1])


def test_a_resumed_run_matches_the_straight_run_on_every_rank(results):
    for rank_results in results:
        straight, first, resumed = (rank_results[k] for k in ("alternate", "alternate_first", "alternate_resumed"))
        assert first["global_step"] == 1 and resumed["global_step"] == 2
        assert resumed["steps"] == straight["steps"][1:]  # the same rounds, prompts and scores
        assert resumed["refill_batches"] == straight["refill_batches"]
        assert resumed["episodes"] == straight["episodes"]
        assert resumed["fingerprint"] == straight["fingerprint"]
