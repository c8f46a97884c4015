"""The N+ miniature's preference pairs, sampled from its SFT policy and labelled by the gold.

N+ samples the reward model's comparison data from its SFT policies, the policies the reward
model then scores. Here, after the `sft` stage, the SFT model answers every training post
(`keyfact_chat` train split) `pairs_samples` times exactly as the bundled pairs were made from the
starting policy (`lit_rlhf/data/bundled/make_keyfact_chat.py`, whose `sample_answers` and
`pair_rows` this reuses: temperature 0.7, the answers that ended paired at random within their
post, the label drawn from Bradley-Terry on the gold, P(first preferred) =
sigmoid((gold_first - gold_second) / pairs_bt_temperature)). The gold is the current key-fact
recall (`lit_rlhf.judges.keyfact.keyfact_recall`), the one `evaluate.py` reads. The rows are
written to `<out>/pairs/train.jsonl` in the `keyfact_chat` schema (`score_chosen` /
`score_rejected` hold each answer's gold), the file the `reward` and `dpo` stages train on. The
same is done on the held-out test posts (`<out>/pairs/test.jsonl`): pairs of the SFT policy's
answers the reward model never saw, on which `evaluate.py` measures its accuracy and its
agreement with the gold.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable

SPLITS = ("train", "test")  # files `train.jsonl`, `test.jsonl`: the directory's splits (as `datasets` names them)


def label_stats(rows: list[dict]) -> dict[str, int]:
    """How many pairs, how many labelled against the gold, how many gold ties (labelled at random)."""
    return {"pairs": len(rows), "against_gold": sum(r["score_chosen"] < r["score_rejected"] for r in rows),
            "gold_ties": sum(r["score_chosen"] == r["score_rejected"] for r in rows)}


def make_pairs(policy: str, budget: dict[str, Any], out_dir: Path, seed: int,
               log: Callable[[str], None] = print, split: str = "train") -> dict[str, Any]:
    """Sample, label and write the pairs of `policy` (the SFT export dir) on the posts of `split`
    (the first `pairs_posts` of them, all where null); returns their statistics."""
    from lit_rlhf.data.bundled import make_keyfact_chat as maker
    from lit_rlhf.judges.keyfact import keyfact_recall

    posts = maker.read_posts(split)
    if budget["pairs_posts"] is not None:
        posts = posts[: budget["pairs_posts"]]
    answers = maker.sample_answers(posts, seed, batch_size=budget["eval_batch_size"], model_name=policy,
                                   samples=budget["pairs_samples"], max_new_tokens=budget["eval_max_new_tokens"],
                                   keep_unended=budget["pairs_keep_unended"])
    rows = maker.pair_rows(posts, answers, random.Random(seed), gold=keyfact_recall,
                           noise_scale=budget["pairs_bt_temperature"])
    if not rows:
        raise RuntimeError(f"the policy {policy} gave no post two distinct answers that ended: no pairs to train on")
    out_dir.mkdir(parents=True, exist_ok=True)
    maker.write(out_dir / f"{split}.jsonl", rows)
    stats = {"posts": len(posts), "answers": sum(map(len, answers)), **label_stats(rows)}
    log(f"   {split} pairs: {stats}")
    return stats


def read_pairs(out_dir: Path, split: str = "train") -> list[dict]:
    with open(out_dir / f"{split}.jsonl") as f:
        return [json.loads(line) for line in f]
