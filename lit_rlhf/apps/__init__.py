"""The command-line tools: `python -m lit_rlhf.apps.<tool>` (compare policies, judge a policy, judge agreement,
pass@k, an lm-evaluation-harness task), each run through `run`."""

from __future__ import annotations

import sys
from typing import Any, Callable


def run(main: Callable[[], Any]) -> None:
    """Run a tool's `main` as `main.py` runs the CLI: the project's own errors (a bad data row, a
    missing model, ...) as one line `error: <message>` on stderr with exit code 2 instead of a
    traceback; `--verbose` (or LIT_RLHF_VERBOSE=1) shows the traceback."""
    from lit_rlhf import console
    from lit_rlhf.cli import error_message, project_error

    verbose = console.verbose_requested(sys.argv[1:])
    sys.argv[1:] = console.strip_verbose_flag(sys.argv[1:])
    try:
        main()
    except Exception as err:
        found = project_error(err)
        if found is None or verbose:
            raise
        print(f"{error_message(found)}\n(run with --verbose for the traceback)", file=sys.stderr)
        raise SystemExit(2) from None
