"""2 processes (DDP) x micro-batch b = 1 process x micro-batch 2b, for DPO and GRPO.

Same global batches (no shuffling), same initial weights, lr 1e-3, 2 optimizer steps; GRPO with
`scale: batch` (the std over the GLOBAL batch, `lit_rlhf.distributed.gather_rows`) and
`aggregation: sequence_mean`, its completions sampled per row from seeds that do not depend on
the split (run_equivalence.py). Tolerances: the logged loss, averaged over ranks, within 1e-5
of the 1-process loss; every updated weight within 1e-4 of the 1-process weight (float32;
the weights move by up to ~2e-3, and measured differences are ~2e-5 for DPO, ~1e-8 for GRPO;
with a rank-local batch std GRPO's weights differ by ~2e-3, and with a different split of the
rows DPO's by ~4e-3).

`token_mean` aggregation is not covered: each rank divides by its own token count, so the mean
of the ranks' losses is not the global token mean (the same holds for micro-batches within a
rank); use `sequence_mean` or `constant_normalizer` when this matters.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from lit_rlhf.models import load_causal_lm, load_tokenizer
from tests.distributed.launch import launch

SCRIPT = Path(__file__).with_name("run_equivalence.py")
LOSS_KEY = {"dpo": "train/loss", "grpo": "train/loss/total"}
WEIGHT_ATOL = 1e-4
LOSS_ATOL = 1e-5


def one_process(methods: str, global_batch: int, out: Path) -> list[dict]:
    """run_equivalence.py's single-process run, in this process (a launch of one more interpreter
    would cost more than the two tiny fits): the same row-seeded sampling, on one thread."""
    from lit_rlhf.online import sources as online_rollout
    from tests.distributed import run_equivalence, workloads

    args = argparse.Namespace(methods=methods, global_batch=global_batch, out=out)
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(workloads, "_WORLD", (0, 1))
        patch.setattr(online_rollout, "generate_responses", run_equivalence.row_seeded_generation(online_rollout.generate_responses))
        torch.set_num_threads(1)
        try:
            return [{method: run_equivalence.run(method, args, "single") for method in methods.split(",")}]
        finally:
            torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    single, double = tmp_path_factory.mktemp("one_process"), tmp_path_factory.mktemp("two_processes")
    args = ["--methods", "dpo,grpo", "--global_batch", "4"]
    two = launch(SCRIPT, args, 2, double, timeout=300)
    return (one_process("dpo,grpo", 4, single), single), (two, double)


@pytest.mark.parametrize("method", ["dpo", "grpo"])
def test_two_processes_match_one_process_with_twice_the_micro_batch(runs, method):
    (one, one_dir), (two, two_dir) = runs
    steps_one = one[0][method]["steps"]
    steps_two = [rank[method]["steps"] for rank in two]
    assert one[0][method]["global_step"] == two[0][method]["global_step"] == 2
    assert len(steps_one) == len(steps_two[0]) == len(steps_two[1]) == 2
    key = LOSS_KEY[method]
    for step, single in enumerate(steps_one):
        ranks = [steps_two[0][step], steps_two[1][step]]
        # the same global batch, split: rank r holds the rows r, r + 2 of it
        assert sorted(ranks[0]["prompts"] + ranks[1]["prompts"]) == sorted(single["prompts"])
        assert ranks[0]["prompts"] == single["prompts"][0::2]
        mean_loss = (ranks[0][key] + ranks[1][key]) / 2
        assert mean_loss == pytest.approx(single[key], abs=LOSS_ATOL), (step, single[key], ranks)
        if method == "grpo":  # the same completions were sampled and scored
            mean_score = (ranks[0]["train/objective/scores"] + ranks[1]["train/objective/scores"]) / 2
            assert mean_score == pytest.approx(single["train/objective/scores"], abs=1e-6)
    w_one = torch.load(one_dir / f"{method}_policy.pt")
    w_two = torch.load(two_dir / f"{method}_policy.pt")
    initial = load_causal_lm("tiny-random-llama", load_tokenizer("tiny-random-llama")).state_dict()
    moved = max(float((w_one[k] - initial[k]).abs().max()) for k in w_one)
    assert moved > 10 * WEIGHT_ATOL, f"the weights barely moved ({moved}): the comparison would be vacuous"
    for name in w_one:
        torch.testing.assert_close(w_two[name], w_one[name], rtol=0, atol=WEIGHT_ATOL, msg=lambda m: f"{name}: {m}")
