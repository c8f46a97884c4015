"""What a reader of a method must hold: the project code one training step runs, traced as it
runs (`tests.reading_trace`), and its constructor's options.

The first training batch of a tiny fit of GRPO, RLOO, PPO and DPO runs under a profiler, from
`on_train_batch_start` to the return of the module's `on_train_batch_end` (the sampling, the
scoring, the update and the hooks), and every `lit_rlhf` function it enters is recorded. Bounds
held here, per method: the files entered (without `types.py` and `ops/`, tensor helpers taken on
trust), their lines, the lines of the functions entered (their full spans, docstrings included)
and, of those, the lines of code (neither blank, comments nor docstrings).

Measured at 882bf0e, before the online step became `OnlineModule`'s methods (files / lines /
function lines, code lines): GRPO 27 / 4,844 / 1,606, 1,198; RLOO 26 / 4,416 / 1,442, 1,080;
PPO 28 / 4,720 / 1,498, 1,109; DPO 14 / 2,736 / 792, 585. `python -m tests.test_reading_set`
prints the table now.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.reading_trace import PACKAGE, REPO, Trace, trace_step

# method: (files, lines of those files, function lines, code lines of those functions) at most: the
# targets, GRPO and RLOO 14 / 3,000 / 1,100, PPO 16 / 3,400 / 1,300, DPO 10 / 2,000 / 650, except
# GRPO's function lines, held at their measure (2026-12-05: GRPO 14 / 2,937 / 1,161 / 896, RLOO 14 /
# 2,662 / 1,012 / 787, PPO 16 / 3,061 / 1,150 / 866, DPO 8 / 1,515 / 534 / 411): RLOO's step plus
# GRPO's own loss, advantages and the variants' hooks (~210 lines).
BOUNDS = {
    "GRPOModule": (14, 3000, 1161, 1100),
    "RLOOModule": (14, 3000, 1100, 1100),
    "PPOModule": (16, 3400, 1300, 1300),
    "DPOModule": (10, 2000, 650, 650),
}


def violations(name: str, trace: Trace) -> list[str]:
    """The bounds `trace` exceeds (none when it holds them)."""
    found = (trace.files, trace.file_lines, trace.function_lines, trace.code_lines)
    labels = ("files", "lines", "function lines", "function code lines")
    return [f"{label} {n} > {bound}" for label, n, bound in zip(labels, found, BOUNDS[name]) if n > bound]


def row(name: str, trace: Trace) -> str:
    return (f"| {name} | {trace.files} | {trace.file_lines:,} | {trace.functions} | {trace.function_lines:,} "
            f"| {trace.code_lines:,} |")


@pytest.mark.xdist_group("reading_trace")
@pytest.mark.parametrize("name", list(BOUNDS))
def test_a_training_step_reads_in_a_few_files(name, tmp_path):
    trace = trace_step(name, tmp_path)
    print(row(name, trace), "\n  " + "\n  ".join(trace.listing))
    assert not violations(name, trace), (violations(name, trace), trace.listing)


@pytest.mark.xdist_group("reading_trace")
def test_a_call_back_helper_put_back_on_the_path_breaks_the_bounds(monkeypatch, tmp_path):
    """The rollout as a free function of the module that calls back into it (the shape the step
    had before, `tests/fixtures/callback_rollout.py`): the trace counts its file and its lines,
    and GRPO's step no longer holds its bounds."""
    from lit_rlhf.modules import GRPOModule
    from tests.fixtures import callback_rollout

    fixtures = REPO / "tests" / "fixtures"
    plain = trace_step("GRPOModule", tmp_path / "plain", roots=(PACKAGE, fixtures))
    monkeypatch.setattr(GRPOModule, "make_rollout", callback_rollout.make_rollout)
    helped = trace_step("GRPOModule", tmp_path / "helped", roots=(PACKAGE, fixtures))
    helper = "tests/fixtures/callback_rollout.py"
    assert any(entry.startswith(helper) for entry in helped.listing) and helped.files == plain.files + 1
    assert helped.file_lines == plain.file_lines + len((fixtures / "callback_rollout.py").read_text().splitlines())
    assert violations("GRPOModule", helped), row("GRPOModule", helped)


def test_the_online_base_has_no_mixins():
    """`OnlineModule`'s bases are the policy base alone: what it does not hold as methods is an
    object passed in (the rollout source) or a pure function (the losses, the update's helpers)."""
    from lit_rlhf.modules import PolicyModule
    from lit_rlhf.modules.online import OnlineModule

    assert OnlineModule.__bases__ == (PolicyModule,)
    assert OnlineModule.__mro__[:OnlineModule.__mro__.index(PolicyModule)] == (OnlineModule,)


def help_options(class_name: str) -> list[str]:
    """The `--model.*` options `python main.py fit --model.help <class>` lists."""
    from jsonargparse import ArgumentParser

    import lit_rlhf.modules as modules

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(getattr(modules, class_name), "model", fail_untyped=False)
    return sorted(a.dest for a in parser._actions if getattr(a, "dest", "").startswith("model."))


# measured: GRPO 43 (61 with the mixins), PPO 46 (60), DPO 20 (24), RLOO 35; `memory`, `rollout`
# and GRPO's `entropy` (Clip-Cov or KL-Cov and the entropy bonus, `losses.EntropyControl`) each count twice
# (the option and its `.help`), their settings live with their objects
@pytest.mark.parametrize("name,most", [("GRPOModule", 43), ("PPOModule", 46), ("DPOModule", 20), ("RLOOModule", 35)])
def test_a_method_lists_few_options(name, most):
    options = help_options(name)
    print(f"{name}: {len(options)} options")
    assert len(options) <= most, (len(options), options)


if __name__ == "__main__":  # python -m tests.test_reading_set: print the table
    import tempfile

    print("| step | files | lines of those files | functions | lines of those functions | code lines |")
    print("|---|---:|---:|---:|---:|---:|")
    for method in BOUNDS:
        with tempfile.TemporaryDirectory() as tmp:
            print(row(method, trace_step(method, Path(tmp))))
    sys.exit(0)
