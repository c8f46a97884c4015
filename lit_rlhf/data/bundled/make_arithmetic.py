"""Write the bundled arithmetic word problems (`bundled:arithmetic`) deterministically, generated
from templates in the GSM8K schema (`question`, `answer`: a worked line, then `#### <number>`):
one operation on small numbers, which a 135M model gets right some of the time. Splits (disjoint
questions): train 600, validation 48, test 200.

Run: `python lit_rlhf/data/bundled/make_arithmetic.py [OUT_DIR]` (default: next to it; a test
checks the committed files are exactly what it writes).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20250520
SPLITS = {"train": 600, "validation": 48, "test": 200}

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jon", "Kai", "Lena", "Mia",
         "Noah", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara"]
ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "cookies", "shells", "stamps", "cards", "coins"]


def _problem(rng: random.Random) -> tuple[str, str]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.choice(["add", "sub", "mul", "div"])
    if kind == "add":
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        q = rng.choice([
            f"{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?",
            f"{name} found {a} {item} on Monday and {b} {item} on Tuesday. How many {item} did {name} find in all?",
        ])
        return q, f"{a} + {b} = {a + b}\n#### {a + b}"
    if kind == "sub":
        b = rng.randint(2, 30)
        a = b + rng.randint(1, 30)
        q = rng.choice([
            f"{name} has {a} {item} and gives {b} of them away. How many {item} does {name} have left?",
            f"There are {a} {item} in a jar. {name} takes out {b}. How many {item} are still in the jar?",
        ])
        return q, f"{a} - {b} = {a - b}\n#### {a - b}"
    if kind == "mul":
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        q = rng.choice([
            f"{name} has {a} bags with {b} {item} in each bag. How many {item} does {name} have?",
            f"A shelf holds {b} {item}. How many {item} do {a} shelves hold?",
        ])
        return q, f"{a} * {b} = {a * b}\n#### {a * b}"
    b, k = rng.randint(2, 9), rng.randint(2, 9)
    a = b * k
    q = f"{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?"
    return q, f"{a} / {b} = {k}\n#### {k}"


def rows() -> dict[str, list[dict[str, str]]]:
    """{split: [{question, answer}]}, every question unique across the splits."""
    rng = random.Random(SEED)
    seen: set[str] = set()
    out: dict[str, list[dict[str, str]]] = {}
    for split, n in SPLITS.items():
        out[split] = []
        while len(out[split]) < n:
            question, answer = _problem(rng)
            if question in seen:
                continue
            seen.add(question)
            out[split].append({"question": question, "answer": answer})
    return out


def main(out_dir: Path = HERE) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, items in rows().items():
        with (out_dir / f"arithmetic.{split}.jsonl").open("w") as f:
            for row in items:
                f.write(json.dumps(row, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
