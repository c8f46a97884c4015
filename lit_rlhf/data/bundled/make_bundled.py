"""Write the small bundled datasets (`bundled:<name>` paths) deterministically.

Every text here is synthetic, written by this script; nothing is copied from the real datasets.
The files follow the published schemas exactly, so the same loaders read them and the hub data:

- `tldr_sft.{train,validation,test}.jsonl`: `id, subreddit, title, post, summary`
  (as `vwxyzjn/summarize_from_feedback_tldr_3_filtered`);
- `tldr_comparisons.{train,validation}.jsonl`: `info{id, post, title, subreddit}, summaries[2],
  choice, worker, batch, split, extra{confidence}` (as the raw `openai/summarize_from_feedback`
  comparisons). The preferred summary always states the post's key fact; the other one is
  vague, so a reward model can learn the preference;
- `ultrafeedback_binarized.{train_prefs,test_prefs}.jsonl`: `prompt, prompt_id, chosen,
  rejected, score_chosen, score_rejected` (as `HuggingFaceH4/ultrafeedback_binarized`); the
  chosen answer is correct, the rejected one wrong;
- `ultrafeedback.train.jsonl`: `source, instruction, models, completions[{model, response,
  overall_score, fine-grained_score, annotations, custom_system_prompt, principle, critique}]`
  (as `openbmb/UltraFeedback`), four completions of graded quality per instruction.

Texts are short (prompts under ~250 bytes, TL;DR summaries under 52 bytes) so that the
byte-level tiny tokenizer fits them in the default lengths.

Run: `python lit_rlhf/data/bundled/make_bundled.py [OUT_DIR]` (default: rewrites the files next
to it; a test checks that the committed files are exactly what it writes).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20240601

# (who, subreddit) x (situation: title, paragraphs, key fact for the summary)
PEOPLE = [("roommate", "relationships"), ("sister", "relationships"), ("boss", "jobs"),
          ("neighbour", "legaladvice"), ("coworker", "jobs"), ("friend", "relationships"),
          ("landlord", "legaladvice"), ("dad", "personalfinance")]
SITUATIONS = [
    ("{Who} keeps borrowing my car",
     ["My {who} borrows my car most weekends.", "Last time it came back with an empty tank."],
     "{who} returns my car with an empty tank"),
    ("{Who} owes me money",
     ["I lent my {who} $200 in March.", "Now they avoid the topic when I ask."],
     "{who} owes me $200 and avoids paying"),
    ("{Who} plays drums at night",
     ["My {who} practises drums after midnight.", "I have work at 7am and can't sleep."],
     "{who} drums after midnight, I can't sleep"),
    ("{Who} read my diary",
     ["I found out my {who} read my diary.", "They quoted it back to me in a fight."],
     "{who} read my diary and quoted it in a fight"),
    ("{Who} forgot my birthday again",
     ["My {who} forgot my birthday for the third year.", "I pretended not to care but I do."],
     "{who} forgot my birthday three years running"),
    ("{Who} takes credit for my ideas",
     ["In meetings my {who} presents my ideas.", "Nobody knows the plans were mine."],
     "{who} presents my ideas as their own"),
    ("{Who} wants me to move out",
     ["My {who} gave me two weeks to move out.", "I have nowhere to go yet."],
     "{who} gave me two weeks to move out"),
    ("{Who} adopted a loud parrot",
     ["My {who} got a parrot that screams all day.", "I work from home and it's constant."],
     "{who}'s parrot screams all day"),
]
QUESTIONS = ["What should I do?", "How do I bring it up?", "Am I overreacting?", "Any advice?"]
VAGUE = [" Having an issue with {who}. Advice?", " {Who} problems. Help?", " Drama with my {who}, not sure what to do.",
         " Long story, need advice."]
POLICIES = ("writer_specific", "writer_vague")


def _tldr_rows(n: int, rng: random.Random, start: int) -> list[dict]:
    rows = []
    for k in range(n):
        who, subreddit = PEOPLE[(start + k) % len(PEOPLE)]
        title, paragraphs, fact = SITUATIONS[(start + k) // len(PEOPLE) % len(SITUATIONS)]
        age = rng.randint(19, 45)
        fill = {"who": who, "Who": who.capitalize()}
        post = "\n\n".join([paragraphs[0].format(**fill) + f" I'm {age}.", paragraphs[1].format(**fill),
                            rng.choice(QUESTIONS)])
        summary = fact.format(**fill).capitalize() + "."
        rows.append({"id": f"syn_{start + k:04d}", "subreddit": subreddit, "title": title.format(**fill),
                     "post": post, "summary": summary, "_who": who})
    return rows


def _public(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    return rows


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
    def aspect(name: str, typed: bool) -> dict:
        a = {"Rating": str(ratings[name]), "Rationale": f"{name.replace('_', ' ')} rated {ratings[name]} of 5."}
        if typed:
            a["Type"] = ["1"]
            a["Rationale For Rating"] = f"Rated {ratings[name]} for {name}."
        return a

    return {"helpfulness": aspect("helpfulness", True), "honesty": aspect("honesty", False),
            "instruction_following": aspect("instruction_following", False),
            "truthfulness": aspect("truthfulness", True)}


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
        rng = random.Random(f"{SEED}-{name}")
        for split, rows in make(rng).items():
            path = out_dir / f"{name}.{split}.jsonl"
            with path.open("w") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
            print(f"wrote {len(rows):3d} rows to {path.name}")


if __name__ == "__main__":
    import sys

    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
