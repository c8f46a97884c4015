"""The N+ miniature with a synthetic gold (experiments/nplus_gold): its configuration, its
statistics by hand, and the whole driver on a tiny model (the `smoke` budget, the same code path
as `full`: every stage through the CLI, every policy evaluated, the report written)."""

from __future__ import annotations

import json
import math

import pytest

from experiments.nplus_gold import report
from experiments.nplus_gold import run as driver


def test_stage_configs_write_under_out_with_the_profiles_model_seed_and_overrides(tmp_path):
    budget = driver.load_budget("smoke", {"seed": 7})
    config = driver.stage_config("reward", budget, tmp_path)
    assert config["seed_everything"] == 7
    assert config["model"]["init_args"]["model"] == str(tmp_path / "sft_model")  # from the SFT policy (N+)
    assert config["model"]["init_args"]["export_dir"] == str(tmp_path / "reward_model")
    for stage in ("reward", "dpo"):  # the pairs the driver samples from the SFT policy
        data = driver.stage_config(stage, budget, tmp_path)["data"]["init_args"]
        assert (data["path"], data["train_split"]) == (str(tmp_path / "pairs"), "train"), stage
    assert config["model"]["init_args"]["lora"]["init_args"]["layers_to_transform"] == [1]
    assert config["trainer"]["callbacks"][1]["init_args"]["data_args"]["val_split"] == "validation_sft[:4]"
    sft = driver.stage_config("sft", budget, tmp_path)
    assert sft["model"]["init_args"]["model"] == "tiny-random-smollm2"
    full = driver.load_budget("full")
    assert driver.stage_config("sft", full, tmp_path)["model"]["init_args"]["model"] == "smollm2-135m-instruct"
    with pytest.raises(ValueError, match="unknown budget knob"):
        driver.load_budget("smoke", {"seeds": [1]})


def test_the_rules_set_the_snapshots_and_are_checked(tmp_path):
    full = driver.load_budget("full")
    assert full["rules"] == {"snapshot_every": 3, "rise_at": 3, "control": "grpo_gold"}
    past = driver.stage_config("grpo_past_kl", full, tmp_path)
    assert driver.snapshot_callback(past)["every_n_train_steps"] == 3
    episodes = past["model"]["init_args"]["total_episodes"] // (4 * past["data"]["init_args"]["batch_size"])
    assert episodes == 27 and episodes % 3 == 0  # the last rollout is a snapshot
    assert driver.stage_config("ppo", full, tmp_path)["model"]["init_args"]["total_episodes"] == 96
    assert driver.snapshot_callback(driver.stage_config("ppo", full, tmp_path)) is None
    with pytest.raises(ValueError, match="multiple of snapshot_every"):
        driver.load_budget("full", {"rules": {"snapshot_every": 3, "rise_at": 10, "control": "grpo_gold"}})
    with pytest.raises(ValueError, match="rules must name"):
        driver.load_budget("full", {"rules": {"snapshot_every": 3, "rise_at": 9}})


def test_pairs_are_the_policys_answers_labelled_by_the_current_gold(tmp_path, monkeypatch):
    from experiments.nplus_gold import pairs
    from lit_rlhf.data.bundled import make_keyfact_chat as maker
    from lit_rlhf.judges.keyfact import keyfact_recall

    posts = maker.read_posts("train")[:3]
    seen = {}

    def fake_sample(posts_, seed, batch_size, model_name, samples, max_new_tokens, keep_unended):
        seen.update(model=model_name, samples=samples, posts=len(posts_), keep=keep_unended)
        return [[p["summary"], "I like turtles."] for p in posts_[:2]] + [["only one answer"]]

    monkeypatch.setattr(maker, "sample_answers", fake_sample)
    budget = {**driver.load_budget("full"), "pairs_posts": 3, "pairs_bt_temperature": 0.01}
    stats = pairs.make_pairs("/sft", budget, tmp_path, seed=5, log=lambda _: None)
    assert seen == {"model": "/sft", "samples": 2, "posts": 3, "keep": False}
    rows = pairs.read_pairs(tmp_path)
    assert stats == {"posts": 3, "answers": 5, "pairs": 2, "against_gold": 0, "gold_ties": 0}
    for row, post in zip(rows, posts):  # near-zero noise: the key fact is always chosen
        assert row["chosen"][-1]["content"] == post["summary"] and row["rejected"][-1]["content"] == "I like turtles."
        assert row["score_chosen"] == round(keyfact_recall(post["summary"], post["summary"]), 4)
    noisy = {**budget, "pairs_bt_temperature": 1e6}  # coin flips: some labels go against the gold
    flips = [pairs.make_pairs("/sft", noisy, tmp_path / str(k), seed=k, log=lambda _: None)["against_gold"]
             for k in range(8)]
    assert 0 < sum(flips) < 16
    monkeypatch.setattr(maker, "sample_answers", lambda *a, **k: [["one"], []])
    with pytest.raises(RuntimeError, match="no pairs"):
        pairs.make_pairs("/sft", budget, tmp_path / "none", seed=1, log=lambda _: None)


def test_every_proxy_arm_starts_from_sft_and_logs_the_gold_it_does_not_optimise(tmp_path):
    budget = driver.load_budget("full")
    for stage in ("dpo", "ppo", "grpo", "grpo_gold", "grpo_past_kl"):
        args = driver.stage_config(stage, budget, tmp_path)["model"]["init_args"]
        assert args["model"] == str(tmp_path / "sft_model"), stage
        if stage in ("ppo", "grpo", "grpo_past_kl"):
            assert args["reward_model"] == str(tmp_path / "reward_model")
            assert args["reward_weights"] == [1.0, 0.0]  # the gold: logged, weight 0
    gold = driver.stage_config("grpo_gold", budget, tmp_path)["model"]["init_args"]
    grpo = driver.stage_config("grpo", budget, tmp_path)["model"]["init_args"]
    assert "reward_model" not in gold and "reward_weights" not in gold
    same = {k for k in grpo if k not in ("reward_model", "reward_weights", "export_dir")}
    assert {k: gold[k] for k in same} == {k: grpo[k] for k in same}  # the control differs only in its reward


def test_length_buckets_and_comparisons_by_hand():
    buckets = report.length_buckets([-1.0, -0.2, 0.1, 0.3, 2.0], [0.0, 0.5, 0.5, 1.0, 0.0], [-0.5, 0.0, 0.5])
    assert [b["n"] for b in buckets] == [1, 1, 2, 1]
    assert buckets[2]["win_rate"]["rate"] == pytest.approx(0.75)
    c = report.compare([0.0, 0.5, 0.5, 1.0], [1.0, 0.5, 1.0, 1.0])
    assert c["mean_diff"] == pytest.approx(0.375) and c["win_rate"]["rate"] == pytest.approx(0.75)
    assert (c["sign_test"]["positive"], c["sign_test"]["negative"], c["sign_test"]["ties"]) == (2, 0, 2)


def _policy(gold, proxy):
    n = len(gold)
    return {"gold": gold, "proxy": proxy, "tokens": [5] * n, "ended": [True] * n}


RULES = {"snapshot_every": 3, "rise_at": 3, "control": "grpo_gold"}
N = 12
NOISE = [0.02 * (i % 3) for i in range(N)]


def _policies(sft_gold=0.5, control_gold=0.8, arms=None, snaps=None):
    """SFT, the arms and the snapshots; every gold/proxy a constant plus a little paired noise."""
    def const(g, p=0.0):
        return _policy([g + e for e in NOISE], [p + e for e in NOISE])

    out = {"start": const(0.2), "sft": const(sft_gold), "dpo": const(sft_gold), "ppo": const(sft_gold),
           "grpo": const(sft_gold), "grpo_gold": const(control_gold)}
    out.update({name: const(*v) for name, v in (arms or {}).items()})
    out.update({f"grpo_past_kl@{step}": const(*v) for step, v in (snaps or {}).items()})
    return out


EVALUATION = {"reward_model": {"agreement_with_gold": {"n": 40, "ci_low": 0.6}}}


def test_over_optimisation_is_read_against_sft_at_the_fixed_snapshots():
    # the gold rises at the fixed snapshot 3 and ends below SFT while the proxy rises: R4 and R5 shown
    shown = _policies(snaps={3: (0.7, 0.5), 6: (0.9, 1.0), 9: (0.3, 2.0)})
    d = report.decisions(shown, EVALUATION, RULES)
    assert report.curve(shown) == ["sft", "grpo_past_kl@3", "grpo_past_kl@6", "grpo_past_kl@9"]
    assert d["R4_over_optimisation"]["shown"] and d["R5_rise_then_fall"]["shown"]
    assert d["R5_rise_then_fall"]["rise_at"] == "grpo_past_kl@3"  # the rule's, not the best (@6)
    # the gold falls from its best earlier snapshot but ends above SFT: the old rule's "shown", not R4's
    above_sft = _policies(snaps={3: (0.7, 0.5), 6: (0.9, 1.0), 9: (0.6, 2.0)})
    d = report.decisions(above_sft, EVALUATION, RULES)
    assert not d["R4_over_optimisation"]["shown"] and d["R5_rise_then_fall"]["shown"]
    # below SFT at every snapshot: the gold never rose, so no rise-then-fall
    never_rose = _policies(snaps={3: (0.4, 0.5), 6: (0.45, 1.0), 9: (0.3, 2.0)})
    d = report.decisions(never_rose, EVALUATION, RULES)
    assert d["R4_over_optimisation"]["shown"] and not d["R5_rise_then_fall"]["shown"]
    # the proxy did not rise: no over-optimisation
    flat = _policies(snaps={3: (0.7, 0.0), 6: (0.5, 0.0), 9: (0.3, 0.0)})
    assert not report.decisions(flat, EVALUATION, RULES)["R4_over_optimisation"]["shown"]
    with pytest.raises(ValueError, match="not a snapshot"):
        report.decisions(shown, EVALUATION, {**RULES, "rise_at": 12})


def test_beats_sft_is_read_only_where_the_positive_control_passes():
    arms = {"ppo": (0.7, 1.0), "grpo": (0.4, 1.0), "dpo": (0.5, 0.0)}
    d = report.decisions(_policies(arms=arms), EVALUATION, RULES)
    assert d["R0_positive_control"]["passes"]
    assert [d["R1_vs_sft"][a]["verdict"] for a in ("ppo", "grpo", "dpo")] == [
        "beats SFT", "worse than SFT", "no detectable difference"]
    assert d["P_proxy_raised"]["grpo"]["raised"] and d["P_proxy_raised"]["grpo"]["proxy_fails"]
    assert d["P_proxy_raised"]["ppo"]["raised"] and not d["P_proxy_raised"]["ppo"]["proxy_fails"]
    failed = report.decisions(_policies(control_gold=0.5, arms=arms), EVALUATION, RULES)
    assert not failed["R0_positive_control"]["passes"]
    assert all(c["verdict"].startswith("not read") for c in failed["R1_vs_sft"].values())
    assert failed["R1_vs_sft"]["ppo"]["interval"] == "above 0"  # the numbers stay; the verdict is withheld
    assert not failed["P_proxy_raised"]["grpo"]["proxy_fails"]
    assert report.decisions(_policies(), EVALUATION, RULES)["R2_learned_label_source"] is True
    chance = {"reward_model": {"agreement_with_gold": {"n": 40, "ci_low": 0.45}}}
    assert report.decisions(_policies(), chance, RULES)["R2_learned_label_source"] is False
    nothing = {"reward_model": {"agreement_with_gold": {"n": 0, "ci_low": 0.0}}}  # no held-out pair the gold orders
    assert report.decisions(_policies(), nothing, RULES)["R2_learned_label_source"] is None


def test_an_arm_that_never_raised_its_proxy_is_not_read_as_the_proxy_failing():
    d = report.decisions(_policies(arms={"ppo": (0.3, -0.5), "grpo": (0.3, 0.0)}), EVALUATION, RULES)
    for arm in ("ppo", "grpo"):
        assert not d["P_proxy_raised"][arm]["raised"] and not d["P_proxy_raised"][arm]["proxy_fails"], arm
        assert d["R1_vs_sft"][arm]["verdict"] == "worse than SFT"


@pytest.mark.slow
def test_driver_end_to_end_on_a_tiny_model(tmp_path):
    results = driver.run("smoke", tmp_path, log=lambda _: None)
    assert list(results["stages"]) == list(driver.ORDER)
    made = results["stages"]["pairs"]  # the SFT policy's own answers, gold-labelled: training and held-out
    for split in ("train", "test"):
        assert made[split]["pairs"] > 0 and made[split]["posts"] == 8, split
        assert len((tmp_path / "pairs" / f"{split}.jsonl").read_text().splitlines()) == made[split]["pairs"]
    assert results["reward_model"]["accuracy"]["n"] == made["test"]["pairs"]
    assert results["reward_model"]["path"] == str(tmp_path / "pairs")
    assert list(results["policies"]) == ["start", "sft", "dpo", "ppo", "grpo", "grpo_gold",
                                         "grpo_past_kl@1", "grpo_past_kl@2"]
    for name, s in results["policies"].items():
        assert 0.0 <= s["gold"] <= 1.0 and s["win_rate_vs_reference"]["rate"] <= 0.5, name
        assert sum(b["n"] for b in s["win_rate_vs_reference_by_length"]) == 4
    assert "agreement_with_gold" in results["reward_model"]
    assert set(results["decisions"]["R1_vs_sft"]) == {"dpo", "ppo", "grpo"}
    assert results["over_optimisation_curve"] == ["sft", "grpo_past_kl@1", "grpo_past_kl@2"]
    # each finished stage's resume checkpoint is gone, its export and the snapshots kept
    budget = driver.load_budget("smoke")
    configs = {stage: driver.stage_config(stage, budget, tmp_path) for stage in driver.STAGES}
    resume = [p for stage in driver.STAGES for p in driver.resume_checkpoints(configs[stage])]
    assert len(resume) == len(driver.STAGES) and not any(p.exists() for p in resume)
    assert len(driver.snapshots(configs["grpo_past_kl"])) == 2
    assert results["decisions"]["R5_rise_then_fall"]["rise_at"] == "grpo_past_kl@1"
    assert "R4_over_optimisation" in results["decisions"] and "P_proxy_raised" in results["decisions"]
    curves = results["training_curves"]
    assert all(k is not None for k in curves["grpo_past_kl"]["kl"]) and len(curves["grpo_past_kl"]["kl"]) == 2
    assert all(g is not None and 0 <= g <= 1 for g in curves["ppo"]["gold"])  # the weight-0 gold, logged
    assert all(p is None for p in curves["grpo_gold"]["proxy"])  # the control has no proxy
    samples = json.loads((tmp_path / "samples.json").read_text())
    assert all(len(p["texts"]) == 4 and len(p["gold"]) == 4 for p in samples["policies"].values())
    assert (tmp_path / "gold_vs_kl.png").stat().st_size > 0 and "R3" in (tmp_path / "results.md").read_text()
    assert math.isfinite(results["minutes"])



def test_a_claim_is_read_over_seeds_by_its_rule_on_every_seed(tmp_path):
    from experiments.nplus_gold import pool

    assert pool.reading([True, True, True]) == "replicated"
    assert pool.reading([False, False, False]) == "not replicated"
    assert pool.reading([True, False, True]) == "mixed"
    assert pool.reading([True, None, True]) == "not read on every seed"
    shown = _policies(arms={"ppo": (0.7, 1.0)}, snaps={3: (0.7, 0.5), 6: (0.9, 1.0), 9: (0.3, 2.0)})
    failed = _policies(control_gold=0.5, arms={"ppo": (0.7, 1.0)}, snaps={3: (0.7, 0.5), 9: (0.6, 0.0)})
    decisions = {"seed3": report.decisions(shown, EVALUATION, RULES), "seed4": report.decisions(shown, EVALUATION, RULES),
                 "seed5": report.decisions(failed, EVALUATION, RULES)}
    claims = pool.tally(decisions)
    assert claims["R1 ppo beats SFT"] == {"seeds": {"seed3": True, "seed4": True, "seed5": None},
                                          "reading": "not read on every seed"}
    assert claims["R0 positive control beats SFT"]["reading"] == "mixed"
    assert claims["R4 over-optimisation"]["reading"] == "mixed" and claims["R5 rise then fall"]["reading"] == "replicated"
    assert claims["R2 learned its label source"]["reading"] == "replicated"
    # the pooled differences over seeds x posts, from the seeds' files
    for name, policies in (("seed3", shown), ("seed4", shown)):
        d = tmp_path / name
        d.mkdir()
        budget = {"seed": int(name[-1]), "rules": RULES}
        (d / "results.json").write_text(json.dumps({"budget": budget, "decisions": decisions[name],
                                                    "over_optimisation_curve": report.curve(policies)}))
        # the answers F1 is read from: SFT says the key fact (3 content words), ppo adds a fourth, `cat`
        # (precision 3/4, recall 1: F1 6/7)
        texts = {k: ["the dog barked all night"] * N if k != "ppo" else ["the dog barked all night at my cat"] * N
                 for k in policies}
        (d / "samples.json").write_text(json.dumps({"policies": {k: {**v, "texts": texts[k]} for k, v in policies.items()},
                                                    "references": ["The dog barked all night."] * N}))
    p = pool.pool([tmp_path / "seed3", tmp_path / "seed4"])
    f1 = p["f1_vs_sft_post_hoc"]
    assert f1["ppo"]["seed3"]["mean_diff"] == pytest.approx(-1 / 7) and f1["ppo"]["pooled"]["mean"] == pytest.approx(-1 / 7)
    assert f1["dpo"]["seed4"]["mean_diff"] == 0.0 and "post hoc" in pool.tables(p)
    assert p["seeds"] == {"seed3": 3, "seed4": 4}
    assert list(p["pooled_vs_sft"]) == ["dpo", "ppo", "grpo", "grpo_gold", "grpo_past_kl@3", "grpo_past_kl@9"]
    assert p["pooled_vs_sft"]["ppo"]["gold"]["mean"] == pytest.approx(0.2)
    assert p["pooled_vs_sft"]["grpo_past_kl@9"]["proxy"]["mean"] == pytest.approx(2.0)
    assert "| R5 rise then fall | yes | yes | replicated |" in pool.markdown(p)
    assert p["per_seed"]["ppo"]["seed3"]["gold_vs_sft"]["mean_diff"] == pytest.approx(0.2)
    assert p["per_seed"]["sft"]["seed4"]["gold"] == pytest.approx(0.5 + sum(NOISE) / N)


RESULTS = driver.HERE / "results"
CURRENT = ("seed3", "seed4", "seed5")  # the current design's seeds, read together


def _cross_seed_section(readme: str) -> str:
    return readme.split("### Seeds 3, 4 and 5 of this design", 1)[1].split("### Record of the old design", 1)[0]


def _numbers_not_in_the_files(readme: str) -> list[str]:
    from tests.helpers import decimals_not_in_files

    tables = [RESULTS / seed / "results.md" for seed in CURRENT] + [RESULTS / "pooled.md"]
    jsons = [RESULTS / seed / name for seed in CURRENT for name in ("results.json", "stages.json")]
    return decimals_not_in_files(_cross_seed_section(readme), tables, [*jsons, RESULTS / "pooled.json"])


def test_the_readme_shows_the_pooled_seeds_and_reads_only_numbers_the_files_hold():
    from experiments.nplus_gold import pool
    from experiments.readme_block import block
    from tests.helpers import REPO_ROOT

    readme = (REPO_ROOT / "experiments" / "README.md").read_text()
    saved = json.loads((RESULTS / "pooled.json").read_text())
    assert list(saved["seeds"]) == list(CURRENT)
    assert block(readme, "nplus_pooled") == pool.tables(saved)
    assert (RESULTS / "pooled.md").read_text() == pool.markdown(saved)
    assert _numbers_not_in_the_files(readme) == []
    assert _numbers_not_in_the_files(readme.replace("### Record of the old design", "0.4321\n### Record of the old design")) == ["0.4321"]
