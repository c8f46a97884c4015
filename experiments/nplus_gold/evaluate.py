"""Held-out evaluation of the N+ miniature's policies: greedy answers, the proxy and the gold.

Every policy answers the same held-out posts (`keyfact_chat` test_sft) greedily with the same
budget, so every comparison is paired post by post. Each answer is scored by:

- the proxy: the stage-2 reward model, read at the EOS of prompt + answer token ids as the online
  modules score rollouts (`lit_rlhf.apps.compare_policies.reward_scores`), replaced by the EOS trick's
  constant for an answer that did not end (the objective PPO and GRPO optimised);
- the gold: the key-fact recall of the post's reference (`lit_rlhf.judges.keyfact`), which no
  stage optimised except the positive control `grpo_gold`.

Lengths are in tokens of the policy's tokenizer (EOS not counted). The reward model's accuracy
and its agreement with the gold are measured on held-out pairs of the SFT policy's answers to the
test posts (`pairs.py`, `<out>/pairs/test.jsonl`: the distribution it scores, labelled as its
training pairs were). The gold is the source of its training labels, so the agreement measures
how well the proxy learned its labelling function on answers it never saw, not the N+ paper's
D17 (agreement with a judge independent of the labels).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any, Callable

PROMPTS = "bundled:keyfact_chat"
PROMPT_CLASS = "lit_rlhf.data.UltraFeedbackPromptDataModule"
PROMPT_SPLIT = "test_sft"
PAIRS_CLASS = "lit_rlhf.data.UltraFeedbackPreferenceDataModule"
PAIRS_SPLIT = "test"  # the held-out pairs of pairs.py


def evaluate(policies: dict[str, str], reward_model: str, budget: dict[str, Any], pairs: str,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """{name: model name, export dir or .ckpt} -> every answer and score (see the module docstring);
    `pairs`: the directory of pairs.py's pairs, whose `test` split holds the held-out pairs."""
    from lit_rlhf.apps.compare_policies import complete, heldout_pairs, objective, reward_scores
    from lit_rlhf.apps.judge_policy import load_policy, load_prompts
    from lit_rlhf.judges.keyfact import keyfact_recall
    from lit_rlhf.rewards.sources import load_reward_model

    prompts, tokenizer = None, None
    answers: dict[str, tuple[list[str], list[list[int]]]] = {}
    for name, path in policies.items():
        model, tokenizer = load_policy(path)
        if prompts is None:
            prompts = load_prompts(PROMPTS, tokenizer, PROMPT_CLASS, PROMPT_SPLIT, budget["eval_prompts"])
        answers[name] = complete(model, tokenizer, prompts.prompt_ids, budget["eval_max_new_tokens"],
                                 budget["eval_batch_size"])
        log(f"   {name}: answered {len(answers[name][0])} posts")
        del model
        gc.collect()
    references = prompts.require_references()
    proxy_model = load_reward_model(reward_model, tokenizer).eval()
    raw = reward_scores(proxy_model, tokenizer.pad_token_id, prompts.prompt_ids,
                        *(ids for _, ids in answers.values()), batch_size=budget["eval_batch_size"])
    eos = tokenizer.eos_token_id
    out: dict[str, Any] = {
        "prompts": list(prompts.prompts),
        "references": list(references),
        "reference_tokens": [token_count(tokenizer, r) for r in references],
        "policies": {},
    }
    for (name, (texts, ids)), scores in zip(answers.items(), raw):
        out["policies"][name] = {
            "path": policies[name],
            "texts": texts,
            "tokens": [len(r) - (eos in r) for r in ids],
            "ended": [eos in r for r in ids],
            "proxy_raw": scores,
            "proxy": objective(scores, ids, eos, budget["missing_eos_score"]),
            "gold": [keyfact_recall(t, r) for t, r in zip(texts, references)],
        }
    out["reward_model"] = heldout_pairs(proxy_model, tokenizer, pairs, PAIRS_SPLIT, budget["eval_batch_size"],
                                        PAIRS_CLASS, gold="scores")
    return out


def token_count(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


TAGS = {"kl": "train/objective/kl", "proxy": "train/rewards/reward_model", "gold": "train/rewards/keyfact_recall",
        "objective": "train/objective/scores"}


def training_curves(run_dir: str | Path) -> dict[str, list[float | None]]:
    """Per training rollout (logged step): the KL to the reference, the proxy's and the gold's mean
    over the rollout's samples, and the optimised score; None where a run did not log a series."""
    from lit_rlhf.evaluation.logs import read_scalars

    scalars = read_scalars(run_dir)
    series = {key: dict(scalars.get(tag, [])) for key, tag in TAGS.items()}
    steps = sorted(set().union(*(s.keys() for s in series.values())))
    return {"step": steps, **{key: [s.get(step) for step in steps] for key, s in series.items()}}
