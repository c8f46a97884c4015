"""Write the small bundled datasets (`bundled:<name>` paths) deterministically, every text
synthetic, in the published schemas (so the loaders read them as the hub data; the table in
docs/guides/data.md):

- `tldr_sft.{train,validation,test}.jsonl` (`vwxyzjn/summarize_from_feedback_tldr_3_filtered`);
- `tldr_comparisons.{train,validation}.jsonl` (raw `openai/summarize_from_feedback` comparisons):
  the preferred summary states the post's key fact, the other is vague;
- `ultrafeedback_binarized.{train_prefs,test_prefs}.jsonl`: the chosen answer right, the rejected wrong;
- `ultrafeedback.train.jsonl` (`openbmb/UltraFeedback`): four completions of graded quality each.

Texts are short (prompts under ~250 bytes, summaries under 52) to fit the tiny byte-level
tokenizer's default lengths. Run: `python lit_rlhf/data/bundled/make_bundled.py [OUT_DIR]`
(default: next to it; a test checks the committed files are exactly what it writes).
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

from lit_rlhf.data.bundled import make_keyfact
from lit_rlhf.data.bundled.make_keyfact import QUESTIONS, write_splits

HERE = Path(__file__).resolve().parent
SEED = 20240601

PEOPLE, SITUATIONS = make_keyfact.PEOPLE[:8], make_keyfact.SITUATIONS[:8]  # the keyfact data's first eight
VAGUE = [" Having an issue with {who}. Advice?", " {Who} problems. Help?", " Drama with my {who}, not sure what to do.",
         " Long story, need advice."]
POLICIES = ("writer_specific", "writer_vague")


def _tldr_rows(n: int, rng: random.Random, start: int) -> list[dict]:
    rows = []
    for k in range(n):
        who, subreddit = PEOPLE[(start + k) % len(PEOPLE)]
        title, first, second, fact = SITUATIONS[(start + k) // len(PEOPLE) % len(SITUATIONS)]
        age = rng.randint(19, 45)
        fill = {"who": who, "Who": who.capitalize()}
        post = "\n\n".join([first.format(**fill) + f" I'm {age}.", second.format(**fill), rng.choice(QUESTIONS)])
        summary = fact.format(**fill).capitalize() + "."
        rows.append({"id": f"syn_{start + k:04d}", "subreddit": subreddit, "title": title.format(**fill),
                     "post": post, "summary": summary, "_who": who})
    return rows


def _public(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


def tldr_sft(rng: random.Random) -> dict[str, list[dict]]:
    return {"train": _public(_tldr_rows(64, rng, 0)), "validation": _public(_tldr_rows(16, rng, 64)),
            "test": _public(_tldr_rows(16, rng, 80))}


def tldr_comparisons(rng: random.Random) -> dict[str, list[dict]]:
    out = {}
    for split, n, start, tag in (("train", 64, 100, "train"), ("validation", 16, 164, "valid1")):
        rows = []
        for r in _tldr_rows(n, rng, start):
            who = r["_who"]
            good = {"text": " " + r["summary"], "policy": POLICIES[0], "note": ""}
            bad = {"text": rng.choice(VAGUE).format(who=who, Who=who.capitalize()), "policy": POLICIES[1], "note": ""}
            choice = rng.randint(0, 1)
            summaries = [good, bad] if choice == 0 else [bad, good]
            rows.append({
                "info": {"id": r["id"], "post": r["post"], "title": r["title"], "subreddit": r["subreddit"]},
                "split": tag,
                "summaries": summaries,
                "choice": choice,
                "worker": f"worker_{rng.randint(1, 4)}",
                "batch": f"batch_{'ab'[len(rows) % 2]}",
                "extra": {"confidence": rng.randint(1, 9)},
            })
        out[split] = rows
    return out


def _task(rng: random.Random) -> tuple[str, str, str, str]:
    """(instruction, best answer, short correct answer, wrong answer)."""
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        wrong = a + b + rng.randint(1, 5)
        return (f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.", f"{a + b}", f"{a} plus {b} is {wrong}.")
    words = ["garden", "planet", "window", "rabbit", "silver", "candle", "forest", "marble", "pencil", "bridge"]
    w = rng.choice(words)
    if kind == 1:
        return (f"Write the word '{w}' backwards.", f"'{w}' backwards is '{w[::-1]}'.", w[::-1],
                f"'{w}' backwards is '{w[::-1][1] + w[::-1][0] + w[::-1][2:]}'.")
    return (f"Write the word '{w}' in capital letters.", f"In capital letters: {w.upper()}.", w.upper(),
            f"In capital letters: {w.capitalize()}.")


def ultrafeedback_binarized(rng: random.Random) -> dict[str, list[dict]]:
    out = {}
    for split, n in (("train_prefs", 48), ("test_prefs", 16)):
        rows = []
        while len(rows) < n:
            prompt, best, _, wrong = _task(rng)
            user = {"content": prompt, "role": "user"}
            rows.append({
                "prompt": prompt,
                "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(),
                "chosen": [user, {"content": best, "role": "assistant"}],
                "rejected": [user, {"content": wrong, "role": "assistant"}],
                "score_chosen": float(rng.choice([8, 9, 10])),
                "score_rejected": float(rng.choice([2, 3, 4, 5])),
            })
        out[split] = rows
    return out


MODELS = ["synth-large", "synth-medium", "synth-small", "synth-tiny"]


def _annotations(ratings: dict[str, int]) -> dict:
    def aspect(name: str) -> dict:
        a = {"Rating": str(ratings[name]), "Rationale": f"{name.replace('_', ' ')} rated {ratings[name]} of 5."}
        typed = {"Type": ["1"], "Rationale For Rating": f"Rated {ratings[name]} for {name}."}
        return {**a, **typed} if name in ("helpfulness", "truthfulness") else a

    return {name: aspect(name) for name in ("helpfulness", "honesty", "instruction_following", "truthfulness")}


def ultrafeedback(rng: random.Random) -> dict[str, list[dict]]:
    rows = []
    for _ in range(32):
        instruction, best, short, wrong = _task(rng)
        graded = [(best, 5, 9.0), (short, 4, 7.0), (wrong, 2, 3.0), ("I am not sure.", 1, 1.5)]
        completions = []
        for model, (response, level, overall) in zip(rng.sample(MODELS, len(MODELS)), graded):
            ratings = {k: max(1, min(5, level + rng.choice([-1, 0, 0, 1])))
                       for k in ("helpfulness", "honesty", "instruction_following", "truthfulness")}
            completions.append({
                "model": model,
                "response": response,
                "overall_score": overall,
                "fine-grained_score": sum(ratings.values()) / 4.0,
                "annotations": _annotations(ratings),
                "custom_system_prompt": "Answer the question accurately.",
                "principle": "helpfulness",
                "critique": "Correct and clear." if level >= 4 else "The answer is wrong or unhelpful.",
            })
        rng.shuffle(completions)
        rows.append({"source": "synthetic", "instruction": instruction, "models": [c["model"] for c in completions],
                     "completions": completions})
    return {"train": rows}


def main(out_dir: Path = HERE) -> None:
    out_dir = Path(out_dir)
    for name, make in (("tldr_sft", tldr_sft), ("tldr_comparisons", tldr_comparisons),
                       ("ultrafeedback_binarized", ultrafeedback_binarized), ("ultrafeedback", ultrafeedback)):
        write_splits(out_dir, name, make(random.Random(f"{SEED}-{name}")))


if __name__ == "__main__":
    import sys

    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
