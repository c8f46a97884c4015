"""The DataModules at full size: first-run processing time, rows/s with num_proc 1 and 2, peak
memory, and the second (cached) run.

Data: a file of the real schema written to a temp directory (never committed):
- `tldr_comparisons`: the shared real TL;DR comparison rows (`../shared/data/tldr`, or
  `$LIT_RLHF_SHARED_DATA/tldr`) repeated until `--rows`, each copy's texts perturbed (a copy
  number woven into the title, the post and both summaries; the posts' paragraphs rotated), so
  no two rows tokenise alike;
- `tldr_sft`: the same rows in the SFT schema (`id, subreddit, title, post, summary`);
- `ultrafeedback_binarized` / `ultrafeedback`: rows in the published schemas of
  `HuggingFaceH4/ultrafeedback_binarized` and `openbmb/UltraFeedback` (4 completions), whose texts
  are sentences of the shared posts, at UltraFeedback's typical lengths (prompt ~150 tokens,
  answers ~250).

Each measurement runs in its own process with its own `datasets` cache: `setup("fit")` of the
train split, timed (wall clock, and the CPU seconds of the process and its `num_proc` workers,
which a loaded machine inflates less); the peak resident memory of the data work is the high-water mark (VmHWM)
reset just before `setup` (the tokenizer and imports excluded), and, with `num_proc` 2, the largest
worker's peak too. The cached run is a new process on the first run's cache.

    python benchmarks/bench_data.py --rows 100000 --what tldr_comparisons
    python benchmarks/bench_data.py --rows 64000 --what ultrafeedback_binarized --num-proc 1
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("LIT_RLHF_SHARED_DATA", REPO.parent / "shared" / "data"))
KINDS = ("tldr_comparisons", "tldr_sft", "ultrafeedback_binarized", "ultrafeedback")


# --------------------------------------------------------------------------------------------
# data of the real schema
# --------------------------------------------------------------------------------------------


def _real_rows() -> list[dict]:
    path = SHARED / "tldr" / "comparisons.sample.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _perturb(text: str, k: int) -> str:
    words = text.split(" ")
    i = k % max(1, len(words))
    return " ".join(words[:i] + [f"#{k}"] + words[i:])


def _rotate(post: str, k: int) -> str:
    parts = post.split("\n")
    r = k % len(parts)
    return "\n".join(parts[r:] + parts[:r])


def tldr_rows(n: int) -> list[dict]:
    base = _real_rows()
    out = []
    for k in range(n):
        row = json.loads(json.dumps(base[k % len(base)]))
        info = row["info"]
        info["id"] = f"{info['id']}_{k}"
        info["title"] = _perturb(info["title"], k)
        info["post"] = _perturb(_rotate(info["post"], k), k)
        for s in row["summaries"]:
            s["text"] = " " + _perturb(s["text"].lstrip(), k)
        out.append(row)
    return out


def _sentences() -> list[str]:
    out = []
    for r in _real_rows():
        out += [s.strip() + "." for s in r["info"]["post"].replace("\n", " ").split(".") if len(s.strip()) > 20]
    return out


def _text(rng: random.Random, sentences: list[str], words: int) -> str:
    parts, n = [], 0
    while n < words:
        s = rng.choice(sentences)
        parts.append(s)
        n += len(s.split())
    return " ".join(parts)


def ultrafeedback_rows(n: int, binarized: bool) -> list[dict]:
    import hashlib

    rng, sentences = random.Random(0), _sentences()
    out = []
    for k in range(n):
        prompt = f"Question {k}: " + _text(rng, sentences, 110)
        answers = [_text(rng, sentences, 190) for _ in range(4)]
        scores = [float(rng.randint(1, 10)) for _ in range(4)]
        if binarized:
            user = {"content": prompt, "role": "user"}
            hi, lo = max(range(4), key=scores.__getitem__), min(range(4), key=scores.__getitem__)
            if hi == lo:
                lo = (hi + 1) % 4
            out.append({"prompt": prompt, "prompt_id": hashlib.sha256(prompt.encode()).hexdigest(),
                        "chosen": [user, {"content": answers[hi], "role": "assistant"}],
                        "rejected": [user, {"content": answers[lo], "role": "assistant"}],
                        "messages": [user, {"content": answers[hi], "role": "assistant"}],
                        "score_chosen": scores[hi], "score_rejected": scores[lo]})
        else:
            rating = {"Rating": "3", "Rationale": "ok"}
            typed = {"Rating": "3", "Rationale": "ok", "Type": ["1"], "Rationale For Rating": "ok"}
            models = [f"model-{j}" for j in range(4)]
            out.append({"source": "bench", "instruction": prompt, "models": models, "completions": [
                {"model": m, "response": a, "overall_score": s, "fine-grained_score": s / 2,
                 "annotations": {"helpfulness": typed, "honesty": rating, "instruction_following": rating,
                                 "truthfulness": typed},
                 "custom_system_prompt": "", "principle": "helpfulness", "critique": "fine"}
                for m, a, s in zip(models, answers, scores)], "correct_answers": [], "incorrect_answers": []})
    return out


def tldr_sft_rows(n: int) -> list[dict]:
    return [{"id": r["info"]["id"], "subreddit": r["info"]["subreddit"], "title": r["info"]["title"],
             "post": r["info"]["post"], "summary": r["summaries"][r["choice"]]["text"].lstrip()} for r in tldr_rows(n)]


def write_data(kind: str, n: int, path: Path) -> Path:
    rows = {"tldr_comparisons": tldr_rows, "tldr_sft": tldr_sft_rows,
            "ultrafeedback_binarized": lambda m: ultrafeedback_rows(m, True),
            "ultrafeedback": lambda m: ultrafeedback_rows(m, False)}[kind](n)
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


# --------------------------------------------------------------------------------------------
# one measured setup, in its own process
# --------------------------------------------------------------------------------------------


def _vm(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the `num_proc` workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def worker(kind: str, path: str, num_proc: int, tokenizer) -> dict:
    import datasets

    datasets.disable_progress_bars()
    from lit_rlhf import data as D
    from lit_rlhf.models import load_tokenizer

    tok = load_tokenizer(tokenizer, padding_side="right") if isinstance(tokenizer, str) else tokenizer
    cls, kwargs = {
        "tldr_comparisons": (D.TLDRPreferenceDataModule, {"max_completion_length": 169, "truncate_completions": True}),
        "tldr_sft": (D.TLDRSFTDataModule, {"truncate_completions": True}),
        "ultrafeedback_binarized": (D.UltraFeedbackPreferenceDataModule, {"truncate_completions": True}),
        "ultrafeedback": (D.UltraFeedbackSingleDataModule, {"truncate_completions": True}),
    }[kind]
    dm = cls(path, tok, train_split="train", val_split=None, test_split=None, num_proc=num_proc, on_bad_rows="skip",
             **kwargs)
    before = _vm("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: the peak below is the data work's
    t0, cpu0 = time.perf_counter(), _cpu()
    dm.setup("fit")
    seconds, cpu = time.perf_counter() - t0, _cpu() - cpu0
    peak = _vm("VmHWM")
    ds = dm.dataset("train")
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
    return {"kind": kind, "num_proc": num_proc, "seconds": seconds, "cpu_seconds": cpu, "examples": len(ds),
            "skipped": sum(dm.skipped_rows.values()), "rss_before_mb": before, "peak_rss_mb": peak,
            "data_peak_mb": peak - before, "largest_worker_peak_mb": children if num_proc > 1 else None,
            "in_memory": not ds.cache_files == []}


def run_worker(kind: str, path: Path, num_proc: int, tokenizer: str, cache: Path) -> dict:
    env = dict(os.environ, HF_DATASETS_CACHE=str(cache), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, __file__, "--worker", kind, str(path), str(num_proc), tokenizer],
                         env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--what", nargs="+", default=["tldr_comparisons"], choices=KINDS)
    ap.add_argument("--num-proc", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--tokenizer", default="smollm2-135m-instruct")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--worker", nargs=4, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        kind, path, num_proc, tokenizer = args.worker
        import torch

        torch.set_num_threads(2)
        print(json.dumps(worker(kind, path, int(num_proc), tokenizer)))
        return
    results = {"rows": args.rows, "tokenizer": args.tokenizer, "load_before": os.getloadavg(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="bench_data_") as tmp:
        for kind in args.what:
            t0 = time.perf_counter()
            path = write_data(kind, args.rows, Path(tmp) / f"{kind}.jsonl")
            size_mb = path.stat().st_size / 2**20
            print(f"{kind}: wrote {args.rows} rows ({size_mb:.0f} MB) in {time.perf_counter() - t0:.1f} s", flush=True)
            for num_proc in args.num_proc:
                cache = Path(tmp) / f"cache_{kind}_{num_proc}"
                for run in ("first", "cached"):
                    r = run_worker(kind, path, num_proc, args.tokenizer, cache)
                    r.update(run=run, rows=args.rows, file_mb=size_mb, rows_per_s=args.rows / r["seconds"])
                    results["runs"].append(r)
                    print(f"  num_proc {num_proc} {run:6s}: {r['seconds']:7.1f} s (CPU {r['cpu_seconds']:6.1f} s)  "
                          f"{r['rows_per_s']:8.0f} rows/s  "
                          f"examples {r['examples']}  skipped {r['skipped']}  data peak {r['data_peak_mb']:.0f} MB"
                          + (f" (largest worker {r['largest_worker_peak_mb']:.0f} MB)"
                             if r["largest_worker_peak_mb"] else ""), flush=True)
    results["load_after"] = os.getloadavg()
    print(f"load average before {results['load_before']}, after {results['load_after']}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
