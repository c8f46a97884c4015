"""The paired comparison's scoring: shared-prompt reward scores, the optimised objective with the
EOS trick, and the gold read from held-out pairs."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.apps.compare_policies import gold_of_pairs, objective, reward_scores


def test_scores_of_several_completion_sets_equal_one_at_a_time(tiny_tokenizer):
    """Each prompt computed once for its completions (before and after; chosen and rejected)
    gives the scores of scoring each prompt + completion alone, in the callers' order."""
    from lit_rlhf.models.heads import load_scalar_model

    torch.manual_seed(0)
    model = load_scalar_model("tiny-random-llama", tiny_tokenizer).eval()
    pad, eos = tiny_tokenizer.pad_token_id, tiny_tokenizer.eos_token_id
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (9, 4, 12, 7, 5)]
    first = [torch.randint(5, 200, (n,), generator=g).tolist() + [eos] for n in (3, 6, 1, 4, 2)]
    second = [torch.randint(5, 200, (n,), generator=g).tolist() for n in (5, 1, 7, 2, 6)]
    together = reward_scores(model, pad, prompts, first, second, batch_size=4)  # 2 prompts per forward
    alone = [reward_scores(model, pad, [p], [c], batch_size=1)[0][0] for c_set in (first, second)
             for p, c in zip(prompts, c_set)]
    torch.testing.assert_close(torch.tensor(together[0] + together[1]), torch.tensor(alone), atol=1e-5, rtol=0)
    assert len(set(together[0])) == 5  # distinct rows, not one score repeated


def test_objective_applies_the_eos_trick_constant_only_without_eos():
    assert objective([0.5, -0.2], [[4, 2], [4, 5]], eos_token_id=2, missing_eos_score=None) == [0.5, -0.2]
    assert objective([0.5, -0.2], [[4, 2], [4, 5]], eos_token_id=2, missing_eos_score=-1.5) == [0.5, -1.5]


def test_gold_of_pairs_from_notes_or_scores():
    notes = [{"summaries": [{"note": "gold=0.2"}, {"note": "gold=0.8"}], "choice": 1}]
    assert gold_of_pairs(notes, "note") == [(0.8, 0.2)]
    assert gold_of_pairs([{"score_chosen": 0.25, "score_rejected": 0.5}], "scores") == [(0.25, 0.5)]
    with pytest.raises(ValueError, match="pair 0 has no 'gold=<score>' note"):
        gold_of_pairs([{"summaries": [{"note": ""}, {"note": "gold=1"}], "choice": 0}], "note")


# ---- the key-fact golds beside trivial answers, live and rescored ---------------------------

ROW = {"id": "x", "title": "Sister wants me to move out",
       "post": "My sister gave me two weeks to move out. I'm 35 and live in Oslo.\n\nAny advice?",
       "summary": "Sister gave me two weeks to move out.",
       "distractors": [r"(?<![\d$])35(?!\d)", r"\boslo\b", r"\b(?:4|four) years?\b"],
       "false_claims": [r"\bsister (?:has|is)\b(?:(?!\b(?:me|i|you)\b)[^.,])*\bmove out\b"]}


def test_first_sentence_and_the_extractive_answers():
    from lit_rlhf.evaluation.golds import extractive_answers, first_sentence

    assert first_sentence("  I lent $2.50 to him. Now what?") == "I lent $2.50 to him."  # "." inside a number is no end
    assert first_sentence("no end here") == "no end here"
    got = extractive_answers(["first_sentence", "title", "reference"], [ROW])
    assert got == {"first_sentence": ["My sister gave me two weeks to move out."], "title": [ROW["title"]],
                   "reference": [ROW["summary"]]}
    with pytest.raises(ValueError, match="unknown baselines"):
        extractive_answers(["lead3"], [ROW])


def test_score_answers_by_hand():
    from lit_rlhf.evaluation.golds import score_answers

    ref = ROW["summary"]  # sister, gave, two, week, move: 5 content words
    answers = ["My sister has two weeks to move out, I'm 35.", "Sister gave me two weeks to move out."]
    got = score_answers(answers, [ref, ref], [ROW, ROW])
    # the first: 4 of 5 key words (not "gave") among 5 said (+ 35): recall 4/5, precision 4/5
    assert got["recall"] == [pytest.approx(4 / 5), 1.0] and got["f1"] == [pytest.approx(4 / 5), 1.0]
    assert got["distractor"] == [1.0, 0.0] and got["false"] == [1.0, 0.0]
    assert set(score_answers(answers, [ref, ref])) == {"recall_v1", "recall", "f1"}  # no checks: no checked measures
    with pytest.raises(ValueError, match="2 answers, 1 references"):
        score_answers(answers, [ref])


def test_pool_means_and_paired_differences_by_hand():
    from lit_rlhf.evaluation.golds import pool

    seeds = [{"start": {"f1": [0.0, 0.2]}, "trained": {"f1": [0.5, 0.5]}},
             {"start": {"f1": [0.0, 0.2]}, "trained": {"f1": [0.3, 0.3]}}]
    got = pool(seeds, against=["start"])
    assert got["answerers"]["trained"]["f1"]["mean"] == pytest.approx(0.4)
    assert got["answerers"]["start"]["f1"]["mean"] == pytest.approx(0.1)
    diff = got["differences"]["trained - start"]["f1"]
    assert diff["mean"] == pytest.approx(0.3) and diff["num_seeds"] == 2 and diff["num_prompts"] == 2
    assert 0.1 - 1e-9 <= diff["ci_low"] <= diff["ci_high"] <= 0.5 + 1e-9  # the bootstrap's range: cell differences 0.1 to 0.5
    with pytest.raises(ValueError, match="cannot pair"):
        pool(seeds, against=["title"])


def _saved(path, seed, afters):
    import json

    refs = ["Sister gave me two weeks to move out.", "Roommate drums after midnight, I can't sleep."]
    samples = [{"prompt": "p", "reference": r, "before": "No idea.", "after": a} for r, a in zip(refs, afters)]
    path.write_text(json.dumps({"seed": seed, "created": "2026-11-27", "evaluation": {"split": "test_sft"},
                                "samples": samples}))
    return str(path)


def test_rescore_pools_saved_answers_with_baselines(tmp_path):
    import json

    from lit_rlhf.apps.compare_policies import main

    a = _saved(tmp_path / "a.json", 6, ["Sister gave me two weeks to move out.", "I don't know."])
    b = _saved(tmp_path / "b.json", 7, ["My sister has two weeks to move out.", "Roommate drums after midnight."])
    out = tmp_path / "golds.json"
    got = main(["--rescore", a, b, "--checks", "bundled:keyfact_checks", "--baselines", "reference,first_sentence",
                "--output", str(out)])
    assert json.loads(out.read_text())["answerers"] == got["answerers"]
    assert [i["seed"] for i in got["inputs"]] == [6, 7] and got["inputs"][0]["split"] == "test_sft"
    # trained recall: seed 6 (1 + 0) / 2, seed 7 (4/5 + 3/4) / 2 ("can't" adds no content word)
    assert got["per_seed"][0]["trained"]["recall"] == pytest.approx(0.5)
    assert got["per_seed"][1]["trained"]["recall"] == pytest.approx((4 / 5 + 3 / 4) / 2)
    assert got["answerers"]["trained"]["false"]["mean"] == pytest.approx(1 / 4)  # seed 7's "has two weeks"
    assert got["answerers"]["reference"]["recall"]["mean"] == 1.0
    assert set(got["differences"]) == {"trained - start", "trained - reference", "trained - first_sentence"}
    assert got["differences"]["trained - reference"]["recall"]["mean"] == pytest.approx((0.5 + 0.775) / 2 - 1)


def test_rescore_refuses_mismatched_prompts_and_missing_settings(tmp_path):
    from lit_rlhf.apps.compare_policies import main

    a = _saved(tmp_path / "a.json", 6, ["x", "y"])
    b = _saved(tmp_path / "b.json", 7, ["x", "y"])
    other = tmp_path / "b.json"
    other.write_text(other.read_text().replace("Sister gave", "Uncle gave"))
    with pytest.raises(ValueError, match="scores other prompts"):
        main(["--rescore", a, b])
    with pytest.raises(SystemExit):  # --baselines without the checks they copy from
        main(["--rescore", a, "--baselines", "title"])
    with pytest.raises(SystemExit):  # a name that is no baseline
        main(["--rescore", a, "--checks", "bundled:keyfact_checks", "--baselines", "title,lead3"])
    with pytest.raises(SystemExit):  # a live comparison needs its models
        main(["--prompts", "bundled:keyfact_chat"])
    with pytest.raises(ValueError, match="no checks row"):
        main(["--rescore", str(other), "--checks", "bundled:keyfact_checks"])


def test_plain_text_drops_special_tokens(tiny_tokenizer):
    from lit_rlhf.apps.compare_policies import plain_text

    eos = tiny_tokenizer.eos_token
    assert plain_text(f" Sister gave me two weeks to move out.{eos}\n", tiny_tokenizer) == "Sister gave me two weeks to move out."


def test_load_checks_refuses_bad_sources(tmp_path):
    import json

    from lit_rlhf.evaluation.golds import load_checks

    assert len(load_checks("bundled:keyfact_checks")) == 256  # every post of every split, by its key fact
    with pytest.raises(ValueError, match="no bundled dataset 'nope'"):
        load_checks("bundled:nope")
    with pytest.raises(ValueError, match="neither bundled:<name> nor a .jsonl file"):
        load_checks(str(tmp_path / "missing.jsonl"))
    partial = tmp_path / "partial.jsonl"
    partial.write_text(json.dumps({"summary": "x", "title": "t", "post": "p"}) + "\n")
    with pytest.raises(ValueError, match=r"row 0 lacks \['distractors', 'false_claims'\]"):
        load_checks(str(partial))
    twice = tmp_path / "twice.jsonl"
    twice.write_text(2 * (json.dumps(ROW) + "\n"))
    with pytest.raises(ValueError, match="names two posts"):
        load_checks(str(twice))
