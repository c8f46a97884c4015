"""Write the bundled `keyfact_chat` data (the main job's, scripts/quickstart.sh) in the
`HuggingFaceH4/ultrafeedback_binarized` schema, read by the chat DataModules:

- `keyfact_chat.{train,validation,test}_sft.jsonl`: the `keyfact_sft` posts (same ids and splits)
  as one user turn, INSTRUCTION + post, answered by the key fact;
- `keyfact_chat.{train,test}_prefs.jsonl`: the set-up of Gao et al. (2023, "Scaling Laws for Reward
  Model Overoptimization", section 2): the starting policy (SmolLM2-135M-Instruct) samples SAMPLES
  answers per post as the main job's GRPO step does (temperature 0.7, at most MAX_NEW_TOKENS);
  those that ended are paired at random within their post and labelled by Bradley-Terry on the
  gold (`keyfact_recall_v1`, kept), P(first) = sigmoid((gold_first - gold_second) / TEMPERATURE).
  `score_chosen` / `score_rejected` hold each answer's gold (not the label).

Run once (about 20 minutes on 2 CPU cores, needs the embedded SmolLM2):
`python lit_rlhf/data/bundled/make_keyfact_chat.py [OUT_DIR]`. The sampling's floating point
depends on the machine, so the committed files are the record; a test checks the `_sft` files.
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from typing import Callable

from lit_rlhf.judges.keyfact import keyfact_recall_v1 as keyfact_recall  # the gold of generation time, kept

HERE = Path(__file__).resolve().parent
SEED = 20261126
INSTRUCTION = "Summarize the problem in this post in one short sentence.\n\n{post}"
SAMPLES = 6
MAX_NEW_TOKENS = 32
SAMPLING_TEMPERATURE = 0.7
TEMPERATURE = 0.1  # Bradley-Terry temperature of the labels, in gold units
SFT_SPLITS = ("train", "validation", "test")
PREF_SPLITS = ("train", "test")


def read_posts(split: str, directory: Path = HERE) -> list[dict]:
    with open(directory / f"keyfact_sft.{split}.jsonl") as f:
        return [json.loads(line) for line in f]


def user_turn(row: dict) -> dict[str, str]:
    return {"role": "user", "content": INSTRUCTION.format(post=row["post"])}


def sft_rows(posts: list[dict]) -> list[dict]:
    """One chat row per post: the instruction and post, answered by the key fact."""
    out = []
    for row in posts:
        user = user_turn(row)
        out.append({"prompt": user["content"], "prompt_id": row["id"],
                    "messages": [user, {"role": "assistant", "content": row["summary"]}]})
    return out


def sample_answers(posts: list[dict], seed: int, batch_size: int = 16, model_name: str | None = None,
                   samples: int = SAMPLES, max_new_tokens: int = MAX_NEW_TOKENS,
                   keep_unended: bool = False) -> list[list[str]]:
    """`samples` answers per post from `model_name` (default: the starting policy, SmolLM2-135M-Instruct;
    any name or export dir `load_causal_lm` accepts); only those that ended, as text, unless
    `keep_unended` (then an answer without EOS is kept as its decoded tokens: for random tiny models)."""
    import torch

    from lit_rlhf.models.loading import SMOLLM2_135M_INSTRUCT, load_causal_lm, load_tokenizer

    model_name = model_name or SMOLLM2_135M_INSTRUCT
    tokenizer = load_tokenizer(model_name, padding_side="left")
    model = load_causal_lm(model_name, tokenizer).eval()
    torch.manual_seed(seed)
    out: list[list[str]] = []
    for start in range(0, len(posts), batch_size):
        chunk = posts[start : start + batch_size]
        texts = [tokenizer.apply_chat_template([user_turn(r)], tokenize=False, add_generation_prompt=True) for r in chunk]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            ids = model.generate(**enc, do_sample=True, temperature=SAMPLING_TEMPERATURE, top_k=0, top_p=1.0,
                                 max_new_tokens=max_new_tokens, num_return_sequences=samples,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        responses = ids[:, enc["input_ids"].shape[1]:].tolist()
        for i in range(len(chunk)):
            ended = []
            for response in responses[i * samples : (i + 1) * samples]:
                if tokenizer.eos_token_id in response:
                    response = response[: response.index(tokenizer.eos_token_id)]
                elif not keep_unended:
                    continue
                text = tokenizer.decode(response, skip_special_tokens=keep_unended).strip()
                if text:
                    ended.append(text)
            out.append(ended)
        print(f"sampled {start + len(chunk)}/{len(posts)} posts", file=sys.stderr, flush=True)
    return out


def pair_rows(posts: list[dict], answers: list[list[str]], rng: random.Random,
              gold: Callable[[str, str], float] = keyfact_recall, noise_scale: float = TEMPERATURE) -> list[dict]:
    """Disjoint random pairs of distinct answers within each post, labelled by `gold` (default: the
    gold of generation time) through Bradley-Terry noise of scale `noise_scale` (the labels'
    temperature, in gold units)."""
    out = []
    for row, texts in zip(posts, answers):
        texts = list(dict.fromkeys(texts))  # distinct, first-seen order
        rng.shuffle(texts)
        user = user_turn(row)
        for a, b in zip(texts[0::2], texts[1::2]):
            gold_a, gold_b = gold(a, row["summary"]), gold(b, row["summary"])
            first_wins = rng.random() < 1.0 / (1.0 + math.exp((gold_b - gold_a) / noise_scale))
            (chosen, gold_c), (rejected, gold_r) = ((a, gold_a), (b, gold_b)) if first_wins else ((b, gold_b), (a, gold_a))
            chosen_messages = [user, {"role": "assistant", "content": chosen}]
            out.append({"prompt": user["content"], "prompt_id": row["id"], "chosen": chosen_messages,
                        "rejected": [user, {"role": "assistant", "content": rejected}], "messages": chosen_messages,
                        "score_chosen": round(gold_c, 4), "score_rejected": round(gold_r, 4)})
    return out


def write(path: Path, rows: list[dict]) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def write_sft(out_dir: Path = HERE) -> None:
    for split in SFT_SPLITS:
        write(out_dir / f"keyfact_chat.{split}_sft.jsonl", sft_rows(read_posts(split)))


def main(out_dir: Path = HERE) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_sft(out_dir)
    rng = random.Random(SEED)
    for k, split in enumerate(PREF_SPLITS):
        posts = read_posts(split)
        rows = pair_rows(posts, sample_answers(posts, SEED + k), rng)
        write(out_dir / f"keyfact_chat.{split}_prefs.jsonl", rows)
        flipped = sum(r["score_chosen"] < r["score_rejected"] for r in rows)
        ties = sum(r["score_chosen"] == r["score_rejected"] for r in rows)
        print(f"{split}_prefs: {len(rows)} pairs, {flipped} labels against the gold, {ties} gold ties", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
