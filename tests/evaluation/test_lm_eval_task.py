"""The lm-evaluation-harness path: a task from local files scored by the verifiable checker, and
`python -m lit_rlhf.apps.lm_eval_task` (export, then the harness) on the tiny model; the
`lm_eval` command it prints runs too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_rlhf.apps import lm_eval_task as app
from lit_rlhf.evaluation.harness import process_results, write_task
from lit_rlhf.rewards import answers_match

REPO = Path(__file__).resolve().parents[2]


def test_process_results_is_the_verifiable_checker():
    doc = {"question": "2 + 2?", "answer": "2 + 2 = 4\n#### 4"}
    assert process_results(doc, [" 4"]) == {"acc": 1.0}
    assert process_results(doc, [" 4.0, I think"]) == {"acc": 1.0}   # an equivalent form
    assert process_results(doc, [" 5"]) == {"acc": 0.0}
    assert process_results(doc, ["five"]) == {"acc": 0.0}
    assert process_results({"solution": "\\boxed{\\frac12}", "_reference_field": "solution"}, ["0.5"]) == {"acc": 1.0}


def test_write_task_from_local_files(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"problem": "p", "solution": "\\boxed{1}"}) + "\n")
    out = write_task(tmp_path / "tasks", [data], name="mine", schema="math", prompt_template="Q: {question}\nA:")
    text = (out / "mine.yaml").read_text()
    assert f'test: ["{data.resolve()}"]' in text and 'doc_to_text: "Q: {{problem}}\\nA:"' in text
    assert "process_docs: !function utils.with_reference_solution" in text and "dataset_path: json" in text
    assert "def with_reference_solution" in (out / "utils.py").read_text()
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        write_task(tmp_path / "t2", [tmp_path / "missing.jsonl"])
    with pytest.raises(ValueError, match="bundled:<alias>"):
        app.data_files("some/hub-id", "test", None)
    with pytest.raises(ValueError, match="its splits"):
        app.data_files("bundled:arithmetic", "dev", None)


def test_the_harness_on_the_tiny_model(tmp_path, capsys):
    torch.set_num_threads(1)
    summary = app.main(["--policy", "tiny-random-llama", "--limit", "3", "--max_gen_toks", "4", "--batch_size", "3",
                        "--output_dir", str(tmp_path)])
    assert summary["n"] == 3 and summary["acc"] is not None and 0.0 <= summary["acc"] <= 1.0
    saved = json.loads((tmp_path / "results.json").read_text())
    for sample in saved["samples"]:  # every score is the checker's verdict on the generation
        assert sample["acc"] == float(answers_match(sample["doc"]["answer"], sample["generation"]))
    assert (tmp_path / "policy" / "config.json").is_file()
    # the printed command runs the same task by hand
    assert summary["command"] in capsys.readouterr().out
    command = summary["command"].split()
    assert command[0] == "lm_eval"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "lm_eval", *command[1:], "--limit", "2"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "lit_rlhf_qa" in run.stdout and "acc" in run.stdout
