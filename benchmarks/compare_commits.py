"""A method's step time and peak memory at two commits, side by side in one run: does a change slow
training, or make it hold more?

    python -m benchmarks.compare_commits --base 1044d8f --methods grpo dpo --pairs 3 \
        --json benchmarks/results/commits_1044d8f.json -- --model smollm2-135m-instruct --steps 4 --warmup 1

checks the base commit and the head commit (`--head`, default HEAD: uncommitted changes are not
measured) out in temporary git worktrees and runs `python -m benchmarks.bench_<method> --frameworks
ours --rounds 1 --no-bare` (plus the arguments after `--`) in the two trees in turn, in alternating order (base first in odd pairs, head first in even ones), so a drift
of the machine's speed or load reaches both sides alike. Each run gives its median step time; the
figure to quote is the median over pairs of head / base (below 1: the head is faster), with the
range of the pairs beside it: on a shared machine one pair alone says little.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def step_median(tree: Path, method: str, bench_args: list[str], out: Path) -> tuple[float, float | None]:
    """The median step time (s) and the peak RSS (MiB) of one benchmark process run from `tree`'s code."""
    command = [sys.executable, "-m", f"benchmarks.bench_{method}", "--frameworks", "ours", "--rounds", "1",
               "--no-bare", *bench_args, "--json", str(out)]
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} in {tree} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    ours = result["frameworks"]["ours"]
    peak = ours.get("peak_rss_mb")
    return float(ours["step_time_s"]["median"]), None if peak is None else float(peak)


def compare(base: str, head: str, methods: list[str], pairs: int, bench_args: list[str]) -> dict[str, Any]:
    base, head = git("rev-parse", base), git("rev-parse", head)
    out: dict[str, Any] = {
        "base": base, "head": head, "pairs": pairs, "bench_args": bench_args,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(), "load_average_before": os.getloadavg(),
        "methods": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        base_tree, head_tree = Path(tmp) / "base", Path(tmp) / "head"
        git("worktree", "add", "--detach", str(base_tree), base)
        git("worktree", "add", "--detach", str(head_tree), head)
        try:
            for method in methods:
                rows = []
                for i in range(pairs):
                    order = [("base", base_tree), ("head", head_tree)]
                    if i % 2:
                        order.reverse()
                    row: dict[str, Any] = {}
                    for name, tree in order:
                        row[name], row[f"{name}_peak_rss_mb"] = step_median(tree, method, bench_args,
                                                                            Path(tmp) / f"{method}_{name}_{i}.json")
                    row["ratio"] = row["head"] / row["base"]
                    rows.append(row)
                    print(f"{method} pair {i + 1}: base {row['base']:.2f} s, head {row['head']:.2f} s, "
                          f"head/base {row['ratio']:.3f}; peak RSS base {row['base_peak_rss_mb']} MiB, "
                          f"head {row['head_peak_rss_mb']} MiB", flush=True)
                ratios = [r["ratio"] for r in rows]
                out["methods"][method] = {
                    "pairs": rows,
                    "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                    "base_step_s_median": statistics.median(r["base"] for r in rows),
                    "head_step_s_median": statistics.median(r["head"] for r in rows),
                    **{f"{side}_peak_rss_mb_median": statistics.median(r[f"{side}_peak_rss_mb"] for r in rows)
                       for side in ("base", "head") if all(r[f"{side}_peak_rss_mb"] is not None for r in rows)},
                }
        finally:
            for tree in (base_tree, head_tree):
                git("worktree", "remove", "--force", str(tree))
    out["load_average_after"] = os.getloadavg()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, bench_args = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare with")
    parser.add_argument("--head", default="HEAD", help="the commit measured against it (default HEAD)")
    parser.add_argument("--methods", nargs="+", default=["grpo", "dpo"], help="benchmarks.bench_<method> to run")
    parser.add_argument("--pairs", type=int, default=3, help="base/head pairs per method (order alternates)")
    parser.add_argument("--json", help="write the result there")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be >= 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still removes its worktrees
    result = compare(args.base, args.head, args.methods, args.pairs, bench_args)
    for method, figures in result["methods"].items():
        print(f"{method}: head/base step time {figures['ratio_median']:.3f} (pairs {figures['ratio_min']:.3f}-"
              f"{figures['ratio_max']:.3f}); medians base {figures['base_step_s_median']:.2f} s, "
              f"head {figures['head_step_s_median']:.2f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
