"""Helpers for the data tests: rows built in the exact published schemas, written to tmp files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)


def write_parquet(path: Path, rows: list[dict]) -> str:
    """Parquet keeps NaN / inf, which strict JSON cannot."""
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


def read_jsonl(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def binarized_row(k: int, prompt: str | None = None, good: str | None = None, bad: str | None = None,
                  score_chosen: float = 8.0, score_rejected: float = 3.0) -> dict:
    """One row of `HuggingFaceH4/ultrafeedback_binarized` (train_prefs / test_prefs schema)."""
    prompt = prompt or f"Name a colour number {k}."
    user = {"content": prompt, "role": "user"}
    return {
        "prompt": prompt,
        "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(),
        "chosen": [user, {"content": good or f"Colour {k} is blue.", "role": "assistant"}],
        "rejected": [user, {"content": bad or f"I will not say {k}.", "role": "assistant"}],
        "score_chosen": score_chosen,
        "score_rejected": score_rejected,
    }


def openbmb_completion(model: str, response: str, overall: float, fine: float) -> dict:
    rating = {"Rating": "3", "Rationale": "ok"}
    typed = {"Rating": "3", "Rationale": "ok", "Type": ["1"], "Rationale For Rating": "ok"}
    return {
        "model": model,
        "response": response,
        "overall_score": overall,
        "fine-grained_score": fine,
        "annotations": {"helpfulness": typed, "honesty": rating, "instruction_following": rating,
                        "truthfulness": typed},
        "custom_system_prompt": "Be helpful.",
        "principle": "helpfulness",
        "critique": "fine",
    }


def openbmb_row(k: int, scores: list[float], fine: list[float] | None = None) -> dict:
    """One row of `openbmb/UltraFeedback`."""
    fine = fine or [s / 2 for s in scores]
    models = [f"model-{j}" for j in range(len(scores))]
    return {
        "source": "test",
        "instruction": f"Count to {k}.",
        "models": models,
        "completions": [openbmb_completion(m, f"Answer {j} to {k}.", s, f)
                        for j, (m, s, f) in enumerate(zip(models, scores, fine))],
    }


def tldr_sft_row(k: int, post: str | None = None, summary: str | None = None) -> dict:
    """One row of `vwxyzjn/summarize_from_feedback_tldr_3_filtered` (the columns we read)."""
    return {"id": f"t3_{k}", "subreddit": "test", "title": f"Title {k}",
            "post": post or f"First paragraph {k}.\n\nSecond paragraph {k}.", "summary": summary or f"Summary {k}."}


@pytest.fixture(autouse=True, scope="session")
def _quiet_datasets():
    import datasets

    datasets.disable_progress_bars()
    yield
