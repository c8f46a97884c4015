"""The command-line tools (`python -m lit_rlhf.apps.<tool>`) answer a bad data row as `main.py`
does, with one line naming file, split, row and field and exit code 2, and print no deprecation
warning of our own making."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.helpers import REPO_ROOT, subprocess_env

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tool(name: str, args: list[str], cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"lit_rlhf.apps.{name}", *args], cwd=cwd, env=subprocess_env(),
                          capture_output=True, text=True, timeout=600)


def one_line_error(done: subprocess.CompletedProcess, *parts: str) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and all(p in lines[0] for p in parts), done.stderr[-3000:]


def test_judge_policy_bad_row_is_one_line_and_a_good_run_warns_of_nothing(tmp_path):
    rows = [json.loads(line) for line in (REPO_ROOT / "lit_rlhf/data/bundled/tldr_sft.validation.jsonl").open()][:3]
    rows[1]["post"] = None
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "judge.yaml").write_text(yaml.safe_dump({"judge": {"class_path": "lit_rlhf.judges.LocalLMJudge",
                                                                   "init_args": {"model_name": "tiny-random-llama"}}}))
    common = ["--policy", "tiny-random-llama", "--judge", "judge.yaml", "--num_prompts", "2", "--max_new_tokens", "3"]
    one_line_error(tool("judge_policy", ["--prompts", "bad.jsonl", "--split", "train", *common], tmp_path),
                   "bad.jsonl, line 2", "split 'train'", "row 1", "field 'post'")
    done = tool("judge_policy", ["--prompts", "bundled:tldr_sft", *common], tmp_path)
    assert done.returncode == 0 and "Warning" not in done.stderr, done.stderr[-3000:]


def test_pass_at_k_bad_row_is_one_line(tmp_path):
    (tmp_path / "qa.jsonl").write_text('{"answer": "#### 9", "question": "3*3?"}\n{"answer": "#### 4"}\n')
    (tmp_path / "qa.yaml").write_text(yaml.safe_dump({"data": {"class_path": "lit_rlhf.data.QADataModule", "init_args": {
        "path": "qa.jsonl", "schema": "gsm8k", "chat": False, "prompt_template": "Question: {question}\nAnswer:",
        "train_split": None, "val_split": None, "test_split": "train"}}}))
    done = tool("pass_at_k", ["--config", "qa.yaml", "--before", "tiny-random-llama", "--split", "train", "--n", "2",
                              "--k", "1", "--max_new_tokens", "3"], tmp_path)
    one_line_error(done, "qa.jsonl, line 2", "split 'train'", "row 1", "field 'question'")
