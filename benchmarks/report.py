"""Markdown tables of the benchmark JSON files (for RESULTS.md).

    python -m benchmarks.report benchmarks/results/*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence


def write_block(text: str, begin: str, end: str, title: str, after: str, path: Path | None = None) -> None:
    """Put `text` between the markers `begin` and `end` of RESULTS.md (or `path`); the first time, a
    section `## {title}` holding them goes right after the section that starts with `after`."""
    path = path or Path(__file__).resolve().parent / "RESULTS.md"
    md = path.read_text()
    block = f"{begin}\n{text}\n{end}"
    if begin in md:
        before, rest = md.split(begin, 1)
        md = before + block + rest.split(end, 1)[1]
    else:
        anchor = md.index("\n## ", md.index(after) + 1)
        md = md[:anchor] + "\n" + f"\n## {title}\n\n" + block + "\n" + md[anchor:]
    path.write_text(md)


def _s(summary: dict | None, digits: int = 3) -> str:
    if not summary:
        return "-"
    return f"{summary['median']:.{digits}f} ({summary['min']:.{digits}f}-{summary['max']:.{digits}f})"


def table(paths: Sequence[str]) -> str:
    lines = [
        "| method | model | framework | step s, median (min-max) | per opt. step s | tok/s | compl./s | mean compl. len "
        "| gen s | update s | step peak MiB (process) | overhead x, median (min-max) | ours/TRL step | ours/TRL step peak "
        "| load before/after |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        r = json.loads(Path(path).read_text())
        ratio = r.get("ours_over_trl", {})
        load = f"{r['load_average_before'][0]:.1f}/{r['load_average_after'][0]:.1f}"
        for fw, e in r["frameworks"].items():
            ratio_text = rss_text = ""
            if ratio and fw == "ours":
                rounds = ", ".join(f"{x:.2f}" for x in ratio["step_time_per_round"])
                ratio_text = f"{ratio['step_time']:.2f} (rounds {rounds})"
                rss_text = f"{ratio['peak_rss']:.2f}"
            info = e.get("info") or {}
            length = info.get("mean_completion_length")
            process = info.get("process_peak_rss_mb")
            peak = f"{e['peak_rss_mb']:.0f}" + (f" ({process:.0f})" if process else "")
            lines.append(
                f"| {r['method']} | {r['model']} | {fw} | {_s(e['step_time_s'])} | {e['time_per_optimizer_step_s']:.3f} "
                f"| {e['tokens_per_s']:.0f} | {e.get('completions_per_s', 0):.2f} | {f'{length:.1f}' if length else '-'} "
                f"| {_s(e.get('generation_time_s'))} | {_s(e.get('update_time_s'))} | {peak} "
                f"| {_s(e.get('overhead_ratio'), 2)} | {ratio_text} | {rss_text} | {load} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    paths = list(sys.argv[1:] if argv is None else argv)
    if not paths:
        raise SystemExit("usage: python -m benchmarks.report benchmarks/results/*.json")
    print(table(paths))


if __name__ == "__main__":
    main()
