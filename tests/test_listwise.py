"""Ranked lists as a batch: the Plackett-Luce losses against hand-computed values, lists that
never split or fuse (collator, sampler, DataModule), listwise DPO and the ranking reward model."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from lit_rlhf.data import BadRowError, UltraFeedbackListDataModule
from lit_rlhf.data.collate import ListCollator
from lit_rlhf.losses import bradley_terry_loss, dpo_loss, listwise_dpo_loss, plackett_luce_loss, rank_by_scores
from lit_rlhf.types import ListBatch
from tests.data.conftest import openbmb_row, write_jsonl

LOG = math.log
EXP = math.exp
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "quickstart" / "listwise_dpo.yaml"


# ------------------------------------------------------------------------------------------------
# losses
# ------------------------------------------------------------------------------------------------


def test_plackett_luce_hand_value_k3():
    # completions a, b, c with utilities 2, 0, 1, ranked a > c > b
    out = plackett_luce_loss(torch.tensor([[2.0, 0.0, 1.0]]), torch.tensor([[0, 2, 1]]))
    # P = e^2/(e^2+e^0+e^1) * e^1/(e^1+e^0) * 1
    expected = (LOG(EXP(2) + EXP(0) + EXP(1)) - 2) + (LOG(EXP(1) + EXP(0)) - 1) + 0.0
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)  # 0.7209...
    assert out.accuracy.item() == 1.0 and out.top1.item() == 1.0  # a>c, a>b, c>b all right


def test_listwise_dpo_hand_value_k4_and_a_reversed_ranking():
    policy = torch.tensor([[-1.0, -2.0, -3.0, -4.0]])
    ref = torch.tensor([[-2.0, -2.0, -2.0, -2.0]])
    ranking = torch.tensor([[1, 0, 3, 2]])  # y1 > y0 > y3 > y2
    out = listwise_dpo_loss(policy, ref, ranking, beta=0.5)
    # implicit rewards u = 0.5 * (policy - ref) = [0.5, 0, -0.5, -1]; in rank order [0, 0.5, -1, -0.5]
    expected = ((LOG(EXP(0) + EXP(0.5) + EXP(-1) + EXP(-0.5)) - 0)
                + (LOG(EXP(0.5) + EXP(-1) + EXP(-0.5)) - 0.5)
                + (LOG(EXP(-1) + EXP(-0.5)) + 1))
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert out.utilities.tolist() == [[0.5, 0.0, -0.5, -1.0]]
    # ranked pairs (1,0) (1,3) (1,2) (0,3) (0,2) (3,2): right are 0>-1, 0>-0.5, 0.5>-1, 0.5>-0.5 -> 4/6
    assert out.accuracy.item() == pytest.approx(4 / 6)
    assert out.top1.item() == 0.0  # the top-ranked y1 does not have the highest reward
    # the order matters: reversed, the loss is another number
    reversed_out = listwise_dpo_loss(policy, ref, ranking.flip(-1), beta=0.5)
    assert abs(reversed_out.loss.item() - expected) > 0.1


def test_two_completions_are_dpo_and_bradley_terry():
    chosen, rejected = torch.tensor([0.3, -1.2]), torch.tensor([-0.4, 0.9])
    first = torch.tensor([[0, 1], [0, 1]])  # completion 0 is the chosen one
    pl = plackett_luce_loss(torch.stack([chosen, rejected], dim=1), first)
    assert pl.loss.item() == pytest.approx(bradley_terry_loss(chosen, rejected).loss.item(), abs=1e-6)
    ref_c, ref_r = torch.tensor([0.1, 0.2]), torch.tensor([-0.3, 0.0])
    dpo = dpo_loss(chosen, rejected, ref_c, ref_r, beta=0.2)
    lw = listwise_dpo_loss(torch.stack([chosen, rejected], 1), torch.stack([ref_c, ref_r], 1), first, beta=0.2)
    assert lw.loss.item() == pytest.approx(dpo.loss.item(), abs=1e-6)


def test_ties_and_ordering():
    # ties keep the data's order: of the two 3.0s, completion 0 ranks above completion 2
    assert rank_by_scores(torch.tensor([[3.0, 7.0, 3.0, 9.0]])).tolist() == [[3, 1, 0, 2]]
    # equal utilities: every order is equally likely, loss log K! per list
    assert plackett_luce_loss(torch.zeros(1, 4), torch.tensor([[2, 0, 3, 1]])).loss.item() == pytest.approx(LOG(24))
    # equal utilities count as wrong in the accuracy
    assert plackett_luce_loss(torch.zeros(1, 3), torch.tensor([[0, 1, 2]])).accuracy.item() == 0.0
    # relabelling the completions (with the ranking) changes nothing
    u, ranking = torch.tensor([[0.2, -1.0, 1.5, 0.4]]), torch.tensor([[2, 3, 0, 1]])
    perm = torch.tensor([3, 1, 0, 2])  # new position p holds old completion perm[p]
    new_ranking = torch.argsort(perm)[ranking]
    assert plackett_luce_loss(u[:, perm], new_ranking).loss.item() == pytest.approx(
        plackett_luce_loss(u, ranking).loss.item(), abs=1e-6)
    with pytest.raises(ValueError, match=r"\(B, K\)"):
        plackett_luce_loss(torch.zeros(4), torch.arange(4))


# ------------------------------------------------------------------------------------------------
# lists never split or fuse
# ------------------------------------------------------------------------------------------------


def _example(prompt, completions, scores, row):
    return {"raw_prompt": "same", "_prompt_ids": prompt, "_completion_ids": completions, "_scores": scores,
            "_row": row}


def test_two_lists_with_the_same_instruction_stay_two_lists():
    prompt = [5, 6, 7]
    examples = [_example(prompt, [[10], [11, 2], [12], [13, 2]], [1.0, 4.0, 2.0, 3.0], 0),
                _example(prompt, [[20], [21], [22, 2], [23]], [9.0, 1.0, 1.0, 5.0], 1)]
    batch = ListCollator(pad_token_id=0)(examples)
    assert isinstance(batch, ListBatch) and batch.input_ids.shape[0] == 8 and batch.num_lists == 2
    assert batch.sharing.groups.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]  # by list, not by prompt tokens
    assert batch.ranking.tolist() == [[1, 3, 2, 0], [0, 3, 1, 2]]  # the tie 1.0 = 1.0: completion 1 first
    assert batch.meta["index"] == [0, 1] and batch.input_ids[4, 3].item() == 20
    # with all rewards equal, two lists of 4 lose log 4! each; one fused list of 8 would lose log 8!
    out = plackett_luce_loss(torch.zeros(batch.scores.shape), batch.ranking)
    assert out.losses.tolist() == pytest.approx([LOG(24), LOG(24)])
    assert out.losses.sum().item() != pytest.approx(LOG(math.factorial(8)))
    with pytest.raises(ValueError, match="one K"):
        ListCollator(0)([examples[0], _example(prompt, [[1], [2], [3]], [1.0, 2.0, 3.0], 2)])


@pytest.fixture(scope="module")
def bundled_lists():
    dm = UltraFeedbackListDataModule("bundled:ultrafeedback", "tiny-random-llama", val_split=None, batch_size=3,
                                     max_prompt_length=128, max_completion_length=64, seed=3)
    dm.setup("fit")
    return dm


def test_the_sampler_keeps_every_list_whole_across_epochs(bundled_lists):
    dm = bundled_lists
    rows = dm.dataset("train").to_list()
    assert len(rows) == 32 and all(len(r["_completion_ids"]) == 4 for r in rows)
    # the bundled sample repeats instructions (one of them 4 times): still 32 lists
    assert max(Counter(r["raw_prompt"] for r in rows).values()) == 4
    orders = []
    for epoch in range(3):
        loader = dm.train_dataloader()
        loader.sampler.set_epoch(epoch)
        seen = []
        for batch in loader:
            k = batch.scores.shape[1]
            assert k == 4 and batch.input_ids.shape[0] == batch.num_lists * k
            for b, row in enumerate(batch.meta["index"]):
                source = rows[row]
                assert batch.meta["responses"][b] == source["responses"]  # the list's own K completions
                assert batch.scores[b].tolist() == pytest.approx(source["_scores"])
                for j in range(k):  # row b*K + j is completion j of list b, after list b's prompt
                    n = b * k + j
                    start = int(batch.prompt_lengths[n])
                    assert batch.input_ids[n, :start].tolist() == source["_prompt_ids"]
                    assert batch.input_ids[n, batch.loss_mask[n]].tolist() == source["_completion_ids"][j]
            seen += batch.meta["index"]
        assert sorted(seen) == list(range(32))  # every list once per epoch, none split or fused
        orders.append(seen)
    assert orders[0] != orders[1]  # reshuffled each epoch (whole lists)


def _uf_files(tmp_path, rows):
    return write_jsonl(tmp_path / "uf" / "train.jsonl", rows)


@pytest.mark.parametrize("edit, field, reason", [
    (lambda r: r["completions"].pop(), "completions", "malformed field"),
    (lambda r: r["completions"][2].update(overall_score=None), "completions[2].overall_score", ""),
    (lambda r: r["completions"][1].update(response=""), "completions[1].response", "missing"),
    (lambda r: [c.update(overall_score=5.0) for c in r["completions"]], "completions[*].overall_score", "no ranking"),
])
def test_bad_rows_are_named(tmp_path, edit, field, reason):
    rows = [openbmb_row(k, [1.0, 2.0, 3.0, 4.0]) for k in range(3)]
    edit(rows[1])
    path = _uf_files(tmp_path, rows)
    dm = UltraFeedbackListDataModule(path, "tiny-random-llama", val_split=None, max_prompt_length=128)
    with pytest.raises(BadRowError) as info:
        dm.setup("fit")
    err = info.value
    assert (err.row, err.field, err.split) == (1, field, "train") and reason in err.reason
    assert "train.jsonl" in str(err) and "line 2" in str(err)


# ------------------------------------------------------------------------------------------------
# the modules
# ------------------------------------------------------------------------------------------------


def _batch(dm, n=2) -> ListBatch:
    return ListCollator(dm.tokenizer.pad_token_id)(dm.dataset("train").select(range(n)).to_list())


def _steps(module, loss_fn, batch, n=4, lr=1e-3) -> list[float]:
    opt = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=lr)
    losses = []
    for _ in range(n):
        loss = loss_fn(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_listwise_dpo_module_starts_at_log_k_factorial_and_learns(bundled_lists):
    from lit_rlhf.modules import ListwiseDPOModule

    torch.manual_seed(0)
    module = ListwiseDPOModule(model="tiny-random-llama", beta=0.5)
    assert (module.loss_type, module.nll_coef) == ("sigmoid", 0.0)  # pinned
    batch = _batch(bundled_lists)
    loss, stats = module.compute_loss(batch)
    assert loss.item() == pytest.approx(LOG(24), abs=1e-5)  # policy = reference: implicit rewards all 0
    assert {"rewards/accuracies", "rewards/top1", "rewards/margins", "logps/mean"} <= set(stats)
    # the shared-prompt forward (a prompt per list) equals the padded rows'
    shared = module.policy_logps(batch.input_ids, batch.attention_mask, batch.loss_mask, sharing=batch.sharing)
    plain = module.policy_logps(batch.input_ids, batch.attention_mask, batch.loss_mask)
    assert torch.allclose(shared, plain, atol=1e-5)
    losses = _steps(module, lambda b: module.compute_loss(b)[0], batch)
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < LOG(24) / 2, losses
    with pytest.raises(TypeError, match="ListBatch"):
        module.compute_loss(batch._asdict())


def test_listwise_reward_module_trains_on_rankings(bundled_lists):
    from lit_rlhf.modules import ListwiseRewardModule

    torch.manual_seed(0)
    module = ListwiseRewardModule(model="tiny-random-llama")
    assert (module.use_margin, module.center_coef) == (False, 0.0)
    batch = _batch(bundled_lists, 3)
    rewards = module.list_rewards(batch)
    assert rewards.shape == (3, 4)
    assert torch.allclose(rewards.view(-1), module(batch.input_ids, batch.attention_mask).float(), atol=1e-5)
    losses = _steps(module, lambda b: plackett_luce_loss(module.list_rewards(b), b.ranking).loss, batch, lr=3e-4)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_listwise_dpo_fits_from_the_quickstart_config(tmp_path):
    from lit_rlhf.cli import main

    cli = main([
        "fit", "--config", str(CONFIG), "--trainer.max_steps=2", "--trainer.val_check_interval=2",
        f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--trainer.callbacks=[]",
        "--model.init_args.model=tiny-random-llama", "--model.init_args.export_dir=null",
        "--model.init_args.lr=1e-3", "--data.init_args.train_split=train[:8]", "--data.init_args.val_split=train[24:28]",
        "--data.init_args.max_completion_length=48", "--data.init_args.truncate_completions=true",
    ])
    assert cli.trainer.global_step == 2
    metrics = cli.trainer.callback_metrics
    for key in ("train/loss", "val/loss", "train/rewards/accuracies", "val/rewards/accuracies"):
        assert key in metrics and math.isfinite(float(metrics[key])), key


def test_ranking_reward_model_fits_through_the_cli_and_is_rebuilt(tmp_path):
    import yaml

    from lit_rlhf.cli import main
    from lit_rlhf.export import load_module
    from lit_rlhf.modules import ListwiseRewardModule

    config = {
        "seed_everything": 1,
        "trainer": {"accelerator": "cpu", "devices": 1, "precision": "32", "max_steps": 2, "val_check_interval": 2,
                    "num_sanity_val_steps": 0, "logger": False, "enable_progress_bar": False,
                    "callbacks": [{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                                   "init_args": {"dirpath": str(tmp_path / "ckpt"), "save_last": True}}]},
        "model": {"class_path": "lit_rlhf.modules.ListwiseRewardModule",
                  "init_args": {"model": "tiny-random-llama", "lr": 1e-4}},
        "data": {"class_path": "lit_rlhf.data.UltraFeedbackListDataModule",
                 "init_args": {"path": "bundled:ultrafeedback", "train_split": "train[:4]", "val_split": "train[24:26]",
                               "max_prompt_length": 128, "max_completion_length": 48, "truncate_completions": True,
                               "batch_size": 2}},
    }
    path = tmp_path / "ranking_reward.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = main(["fit", "--config", str(path), f"--trainer.default_root_dir={tmp_path}"])
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.global_step == 2 and 0.0 <= float(metrics["val/rewards/accuracies"]) <= 1.0
    rebuilt = load_module(str(tmp_path / "ckpt" / "last.ckpt"))
    assert isinstance(rebuilt, ListwiseRewardModule) and rebuilt.use_margin is False
