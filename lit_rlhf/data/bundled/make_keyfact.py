"""Write the bundled `keyfact` data: TL;DR-style posts with a gold key fact, and noisy gold pairs
(the main job's data, scripts/quickstart.sh; every text synthetic).

- `keyfact_sft.{train,validation,test}.jsonl` (TL;DR SFT schema): 16 people x 16 situations, each
  combination in one split; `summary` is the key fact, the gold's reference
  (`lit_rlhf.judges.keyfact`); each post also carries distractor details (age, city, years).
- `keyfact_comparisons.{train,test}.jsonl` (comparisons schema): two candidate summaries of graded
  gold quality (the full fact, the fact made vague, copied sentences, the person only, copied
  details, a reply, a generic line) padded with fillers to equal word counts, labelled by
  Bradley-Terry on the gold, P(first) = sigmoid((gold_first - gold_second) / TEMPERATURE) (Gao et
  al. 2023's synthetic-gold labels; about one in ten disagrees with the gold). `note` holds each
  gold, `extra.confidence` grows with the gap. The gold is `keyfact_recall_v1`, kept unchanged.
- `keyfact_checks.{train,validation,test}.jsonl`: per post the planted `distractors` and
  `false_claims` (regular expressions of statements the post contradicts, matched against the
  normalised answer), for `lit_rlhf.judges.keyfact.listed_matches`.

Run: `python lit_rlhf/data/bundled/make_keyfact.py [OUT_DIR]` (default: next to it; a test checks
the committed files are exactly what it writes).
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

from lit_rlhf.judges.keyfact import content_words_v1 as content_words
from lit_rlhf.judges.keyfact import keyfact_recall_v1 as keyfact_recall

HERE = Path(__file__).resolve().parent
SEED = 20261125
TEMPERATURE = 0.15  # Bradley-Terry temperature of the labels, in gold units

PEOPLE = [("roommate", "relationships"), ("sister", "relationships"), ("boss", "jobs"), ("neighbour", "legaladvice"),
          ("coworker", "jobs"), ("friend", "relationships"), ("landlord", "legaladvice"), ("dad", "personalfinance"),
          ("mom", "relationship_advice"), ("brother", "relationship_advice"), ("girlfriend", "relationships"),
          ("boyfriend", "relationships"), ("cousin", "relationship_advice"), ("manager", "jobs"),
          ("husband", "relationships"), ("flatmate", "legaladvice")]
# (title, first paragraph, second paragraph, key fact); {who} is the person
SITUATIONS = [
    ("{Who} keeps borrowing my car", "My {who} borrows my car most weekends.", "Last time it came back with an empty tank.",
     "{who} returns my car with an empty tank"),
    ("{Who} owes me money", "I lent my {who} $200 in March.", "Now they avoid the topic when I ask.",
     "{who} owes me $200 and avoids paying"),
    ("{Who} plays drums at night", "My {who} practises drums after midnight.", "I have work at 7am and can't sleep.",
     "{who} drums after midnight, I can't sleep"),
    ("{Who} read my diary", "I found out my {who} read my diary.", "They quoted it back to me in a fight.",
     "{who} read my diary and quoted it in a fight"),
    ("{Who} forgot my birthday again", "My {who} forgot my birthday for the third year.", "I pretended not to care but I do.",
     "{who} forgot my birthday three years running"),
    ("{Who} takes credit for my ideas", "In meetings my {who} presents my ideas.", "Nobody knows the plans were mine.",
     "{who} presents my ideas as their own"),
    ("{Who} wants me to move out", "My {who} gave me two weeks to move out.", "I have nowhere to go yet.",
     "{who} gave me two weeks to move out"),
    ("{Who} adopted a loud parrot", "My {who} got a parrot that screams all day.", "I work from home and it's constant.",
     "{who}'s parrot screams all day"),
    ("{Who} eats my lunch", "My {who} keeps eating the lunch I pack for work.", "Yesterday my whole lasagna was gone.",
     "{who} eats my packed lunch, even my lasagna"),
    ("{Who} posted my photos", "My {who} posted my baby photos online.", "Nobody asked me and they got hundreds of likes.",
     "{who} posted my baby photos without asking"),
    ("{Who} wants a loan for a boat", "My {who} asked me for $5000.", "It is to buy a fishing boat.",
     "{who} wants $5000 from me for a boat"),
    ("{Who} smokes on the balcony", "My {who} smokes on the balcony every evening.", "The smoke drifts into my bedroom.",
     "{who} smokes on the balcony into my room"),
    ("{Who} cancelled our trip", "My {who} cancelled our Paris trip the night before.", "I had already paid for the hotel.",
     "{who} cancelled our Paris trip, I paid"),
    ("{Who} fed my dog chocolate", "My {who} gave my dog chocolate while I was out.", "He was sick all night and we went to the vet.",
     "{who} fed my dog chocolate, vet visit"),
    ("{Who} broke my laptop", "My {who} spilled coffee on my laptop.", "It won't turn on and they refuse to pay.",
     "{who} broke my laptop with coffee, won't pay"),
    ("{Who} reads my texts", "My {who} goes through my phone when I shower.", "I caught them reading my texts twice.",
     "{who} reads my texts on my phone"),
]
# per situation (same order), statements the post contradicts; {who} is the person. Subjects
# "i" / "you" are the poster (an answer may address the poster as "you").
_SUBJECT = r"\b(?:{who}|he|she|they)"
FALSE_CLAIMS = [
    [r"\bfull tank\b", r"\b(?:i|you) (?:borrow|borrowed|borrows|took|take)\b[^.]*\bcar\b",
     _SUBJECT + r"(?: has| have| had)? (?:lent|lends|loaned|loans|gave|gives) (?:me|you)\b[^.]*\bcar\b"],
    [r"\b(?:i|you) (?:owe|borrowed)\b", _SUBJECT + r"(?: has| have| had)? (?:lent|loaned|lends|gave) (?:me|you)\b",
     r"\b(?:paid|pays|repaid) (?:me |you )?(?:it )?back\b"],
    [r"\b(?:i|you) (?:practi[cs]e|practi[cs]ed|play|played)\b[^.]*\bdrums?\b", r"\bbefore midnight\b",
     r"\b(?:i|you) (?:can|could) sleep\b"],
    [r"\b(?:i|you) (?:read|found|quoted)\b[^.]*\b(?:his|her|their|{who}) diary\b",
     r"\b(?:read|reads|reading|quoted) (?:his|her|their) (?:own )?diary\b"],
    [r"\bforg[eo]t\w* (?:his|her|their) (?:own )?birthday\b", r"\b(?:i|you) (?:forgot|forget)\b",
     r"\bremember(?:ed|s)?\b[^.]*\bbirthday\b"],
    [r"\b(?:i|you) (?:present|presented|presents|take|took|steal|stole)\b[^.]*\bideas?\b",
     r"\bpresents? (?:his|her|their) (?:own )?ideas\b"],
    [_SUBJECT + r" (?:has|had|have|is|was|are|needs?|must|agreed|plans?|got|will|wants to)\b"
     r"(?:(?!\b(?:me|i|you)\b)[^.,])*\bmov(?:e|es|ed|ing) out\b",
     r"\b(?:i|you) (?:gave|have given|told)\b[^.]*\bmove out\b"],
    [r"\b(?:i|you) (?:got|get|have|adopted|bought|own)\b[^.]*\bparrot\b", r"\bparrots? (?:is|are|was) (?:quiet|silent)\b",
     r"\b(?:never|rarely|not) (?:scream|screams|squawk)\b"],
    [r"\b(?:i|you) (?:ate|eat|eats|eaten|have eaten|took)\b[^.]*\blunch\b",
     r"\b(?:eats?|eaten|eating|ate) (?:his|her|their) (?:own )?(?:packed )?lunch\b"],
    [r"\bposted (?:his|her|their) (?:own )?baby photos\b", r"\b(?:i|you) posted\b", r"\bwith (?:my |your )?permission\b"],
    [r"\b(?:i|you) (?:asked|want|wanted|need|needed|borrowed)\b[^.]*(?:5000|5,000|boat)",
     _SUBJECT + r"(?: has| had)? (?:lent|loaned|gave|offered|lends) (?:me|you)\b"],
    [r"\b(?:i|you) smoke", r"\b(?:stopped|quit|not|never) smok"],
    [r"\b(?:i|you) (?:have |had )?cancel+ed\b", _SUBJECT + r" (?:has |had )?paid\b", r"\brefund"],
    [r"\b(?:i|you) (?:gave|fed|give|feed)\b[^.]*\bchocolate\b", r"\b(?:gave|fed) (?:his|her|their) (?:own )?dog\b"],
    [r"\b(?:i|you) (?:spilled|spilt|spill|broke)\b", r"\b(?:spilled|spilt|poured) coffee on (?:his|her|their) (?:own )?laptop\b",
     r"\b(?:agreed|offered|promised|willing) to pay\b", r"\b(?:paid|will pay|pays) for\b"],
    [r"\b(?:i|you) (?:read|go through|went through|check|checked)\b[^.]*\b(?:his|her|their) (?:phone|texts)\b",
     r"\b(?:reads?|reading|goes through|went through|checks?) (?:his|her|their) (?:own )?(?:phone|texts)\b"],
]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
CITIES = ["Leeds", "Denver", "Austin", "Dublin", "Toronto", "Perth", "Boston", "Oslo"]
QUESTIONS = ["What should I do?", "How do I bring it up?", "Am I overreacting?", "Any advice?"]
VAGUE = ["Long story, need advice.", "Not sure what to do here.", "Drama at home, help?", "Need some advice please."]
FILLERS = ["honestly", "so yeah", "idk", "ugh", "help", "please", "anyway", "lol"]
VAGUE_WORDS = ["something", "stuff", "things", "it"]
ANSWERS = ["Just talk to them about it.", "No, you are not overreacting.", "Don't bring it up.", "Set a boundary.",
           "No advice, sorry.", "Move on and forget it."]


def _combos(rng: random.Random) -> dict[str, list[tuple[int, int]]]:
    combos = [(p, s) for p in range(len(PEOPLE)) for s in range(len(SITUATIONS))]
    rng.shuffle(combos)
    return {"test": sorted(combos[:64]), "validation": sorted(combos[64:96]), "train": sorted(combos[96:])}


def _post(combo: tuple[int, int], rng: random.Random, index: int) -> dict:
    who, subreddit = PEOPLE[combo[0]]
    title, first, second, fact = SITUATIONS[combo[1]]
    fill = {"who": who, "Who": who.capitalize()}
    age, city, years = rng.randint(19, 45), rng.choice(CITIES), rng.randint(2, 9)
    post = "\n\n".join([f"{first.format(**fill)} I'm {age} and live in {city}.",
                        f"We have known each other for {years} years. {second}", rng.choice(QUESTIONS)])
    return {"id": f"keyfact_{index:04d}", "subreddit": subreddit, "title": title.format(**fill), "post": post,
            "summary": fact.format(**fill)[0].upper() + fact.format(**fill)[1:] + ".",
            "_who": who, "_details": (age, city, years), "_sentences": (first.format(**fill), second.format(**fill)),
            "_situation": combo[1]}


def _checks(row: dict) -> dict:
    """What the evaluation may check an answer to `row` against (see the module docstring)."""
    age, city, years = row["_details"]
    who = re.escape(row["_who"])
    span = rf"\b(?:{years}|{NUMBER_WORDS[years]}) years?\b"
    if re.search(span, row["summary"].lower()):  # "three years running" is the key fact, not a detail
        span = r"\bknown each other\b"
    return {"id": row["id"], "title": row["title"], "post": row["post"], "summary": row["summary"],
            "distractors": [rf"(?<![\d$]){age}(?!\d)", rf"\b{city.lower()}\b", span],
            "false_claims": [p.replace("{who}", who) for p in FALSE_CLAIMS[row["_situation"]]]}


def _candidates(row: dict, rng: random.Random) -> dict[str, str]:
    """Candidate summaries of graded gold quality (see the module docstring)."""
    fact = row["summary"]
    words = fact.rstrip(".").split(" ")
    key = content_words(fact)
    replaceable = [i for i, w in enumerate(words) if content_words(w) & key and row["_who"] not in w.lower()]
    out = {"full": fact}
    for k in (1, 2):
        vague = list(words)
        for i in rng.sample(replaceable, min(k, len(replaceable))):
            vague[i] = rng.choice(VAGUE_WORDS)
        out[f"drop{k}"] = " ".join(vague) + "."
    age, city, years = row["_details"]
    out["who"] = f"Issue with my {row['_who']}, need advice."
    out["details"] = rng.choice([f"I'm {age}, live in {city}, {years} years.", f"{years} years, {city}, I'm {age}.",
                                 f"I'm {age} and live in {city}."])
    out["vague"] = rng.choice(VAGUE)
    out["answer"] = rng.choice(ANSWERS)
    # sentences copied from the post: the one with the situation and the one with its consequence
    # each carry part of the key fact, the title less of it, the closing question none
    first, second = row["_sentences"]
    out["copy_first"], out["copy_second"], out["copy_title"] = first, second, row["title"] + "."
    return out


def _pad(a: str, b: str, rng: random.Random) -> tuple[str, str]:
    """Filler words appended to the shorter text until the two have as many words."""
    while len(a.split()) != len(b.split()):
        if len(a.split()) < len(b.split()):
            a = f"{a} {rng.choice(FILLERS)}"
        else:
            b = f"{b} {rng.choice(FILLERS)}"
    return a, b


def _pairs(rows: list[dict], n: int, rng: random.Random, split_tag: str) -> list[dict]:
    out = []
    while len(out) < n:
        row = rows[len(out) % len(rows)]
        cands = _candidates(row, rng)
        kind_a, kind_b = rng.sample(sorted(cands), 2)
        text_a, text_b = _pad(cands[kind_a], cands[kind_b], rng)
        gold_a, gold_b = keyfact_recall(text_a, row["summary"]), keyfact_recall(text_b, row["summary"])
        if gold_a == gold_b:
            continue  # a pair the gold cannot order teaches nothing
        choice = 0 if rng.random() < 1.0 / (1.0 + math.exp(-(gold_a - gold_b) / TEMPERATURE)) else 1
        out.append({
            "info": {"id": row["id"], "post": row["post"], "title": row["title"], "subreddit": row["subreddit"]},
            "split": split_tag,
            "summaries": [{"text": " " + text_a, "policy": f"keyfact_{kind_a}", "note": f"gold={gold_a:.3f}"},
                          {"text": " " + text_b, "policy": f"keyfact_{kind_b}", "note": f"gold={gold_b:.3f}"}],
            "choice": choice,
            "worker": "gold_bradley_terry",
            "batch": f"keyfact_{split_tag}",
            "extra": {"confidence": 1 + min(8, int(abs(gold_a - gold_b) * 9))},
        })
    return out


def keyfact(rng: random.Random) -> dict[str, dict[str, list[dict]]]:
    combos = _combos(rng)
    posts, start = {}, 0
    for split in ("train", "validation", "test"):
        posts[split] = [_post(c, rng, start + i) for i, c in enumerate(combos[split])]
        start += len(combos[split])
    public = {s: [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows] for s, rows in posts.items()}
    comparisons = {"train": _pairs(posts["train"], 160, rng, "train"), "test": _pairs(posts["test"], 96, rng, "test")}
    checks = {s: [_checks(r) for r in rows] for s, rows in posts.items()}
    return {"keyfact_sft": public, "keyfact_comparisons": comparisons, "keyfact_checks": checks}


def write_splits(out_dir: Path, name: str, splits: dict[str, list[dict]]) -> None:
    """`{out_dir}/{name}.{split}.jsonl` for every split, one JSON row a line."""
    for split, rows in splits.items():
        path = Path(out_dir) / f"{name}.{split}.jsonl"
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        print(f"wrote {len(rows):3d} rows to {path.name}")


def main(out_dir: Path = HERE) -> None:
    for name, splits in keyfact(random.Random(SEED)).items():
        write_splits(out_dir, name, splits)


if __name__ == "__main__":
    import sys

    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
