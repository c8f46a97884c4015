"""Judged examples as a markdown table, and the win rate against the length ratio as a figure."""

from __future__ import annotations

import re
from typing import Any, Sequence

from lit_rlhf.judges import LengthRatioBuckets


# every character `str.splitlines` breaks on: a table row must stay one line
_LINE_BREAKS = re.compile("\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


def markdown_cell(text: Any, max_chars: int = 500) -> str:
    """One markdown table cell: pipes escaped, line breaks (any kind) as <br>, cut to `max_chars` characters."""
    text = "" if text is None else str(text)
    if len(text) > max_chars:
        text = text[:max_chars] + " …"
    return _LINE_BREAKS.sub("<br>", text.replace("\\", "\\\\").replace("|", "\\|"))


VERDICTS = {"a": "policy", "b": "baseline", "tie": "tie", "invalid": "invalid"}


def examples_table(rows: Sequence[dict[str, Any]], max_rows: int = 8, max_chars: int = 500) -> str:
    """A markdown table of the first `max_rows` rows: prompt, both completions, verdict, judge output."""
    lines = ["| # | prompt | policy | baseline | verdict | judge output |", "|---|---|---|---|---|---|"]
    for i, row in enumerate(rows[:max_rows]):
        output = row.get("raw") or ""
        if row.get("error"):
            output = f"{output} (error: {row['error']})".strip()
        cells = [str(i), markdown_cell(row["prompt"], max_chars), markdown_cell(row["policy"], max_chars),
                 markdown_cell(row["baseline"], max_chars), VERDICTS.get(row["winner"], row["winner"]),
                 markdown_cell(output, max_chars)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def length_ratio_figure(buckets: LengthRatioBuckets, title: str = "policy win rate against length ratio"):
    """Win rate of the policy per log(len_policy / len_baseline) bucket, with Wilson 95% error bars
    and the number of judged items over each point (N+ paper, Figure 8)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 4))
    ax = fig.add_subplot(1, 1, 1)
    points = [(c, s) for c, s in zip(buckets.centres, buckets.stats) if s.num_valid > 0]
    if points:
        x = [c for c, _ in points]
        y = [s.win_rate for _, s in points]
        err = [[s.win_rate - s.ci_low for _, s in points], [s.ci_high - s.win_rate for _, s in points]]
        ax.errorbar(x, y, yerr=err, fmt="o-", capsize=3)
        for xi, (_, s) in zip(x, points):
            ax.annotate(f"n={s.num_valid}", (xi, 1.02), ha="center", fontsize=7)
    ax.axhline(0.5, color="grey", linestyle="--", linewidth=1)
    ax.axvline(0.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("log(policy tokens / baseline tokens)")
    ax.set_ylabel("policy win rate")
    ax.set_ylim(0.0, 1.08)
    ax.set_title(title)
    fig.tight_layout()
    return fig
