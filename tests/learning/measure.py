"""Rerun the learning runs over several seeds and print what the thresholds are set from.

    python -m tests.learning.measure                 # every method, seeds 0-4
    python -m tests.learning.measure dpo ppo --seeds 0 1 2 3 4 5 6 7
    python -m tests.learning.measure grpo rloo --task case --rollouts 16   # the prompt-dependent task
    python -m tests.learning.measure grpo ppo --kl-coef 0     # online runs with kl_coef 0

Prints, per method, the gain (after - before) of its progress measure for each seed and its
minimum and mean; online runs also print the KL to the initial policy at the end, the offline
preference methods the letter share of their own samples (`runs.letter_share`).
`tests/learning/README.md` records these numbers next to the thresholds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tests.learning.runs import OFFLINE
from tests.learning.runs_online import ONLINE, run_online


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("methods", nargs="*", help=f"default: all of {sorted(OFFLINE) + sorted(ONLINE)}")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--task", choices=("letters", "case"), default="letters", help="online task (runs.run_online)")
    parser.add_argument("--rollouts", type=int, default=8, help="online runs: rollouts per run")
    parser.add_argument("--kl-coef", type=float, default=None, help="online runs: override the KL coefficient")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the tests run (tests/conftest.py `one_thread`)
    for name in args.methods or [*OFFLINE, *ONLINE]:
        if name not in OFFLINE and name not in ONLINE:
            parser.error(f"unknown method {name!r}; expected one of {sorted(OFFLINE) + sorted(ONLINE)}")
        gains, lines = [], []
        for seed in args.seeds:
            started = time.perf_counter()
            overrides = {} if args.kl_coef is None else {"kl_coef": args.kl_coef}
            m = OFFLINE[name](seed) if name in OFFLINE else run_online(name, seed, args.task, args.rollouts, **overrides)
            gains.append(m.gain)
            extra = "" if m.extra_after is None else f" (companion {m.extra_before:.3f} -> {m.extra_after:.3f})"
            extra += "" if m.kl_after is None else f" (KL to the initial policy {m.kl_after:.3f})"
            if m.generated_after is not None:
                extra += f" (letter share {m.generated_before:.3f} -> {m.generated_after:.3f})"
            lines.append(f"  seed {seed}: {m.before:.4f} -> {m.after:.4f}, gain {m.gain:+.4f}{extra} "
                         f"[{time.perf_counter() - started:.1f} s]")
        print(f"{name}: gain min {min(gains):+.4f} mean {statistics.mean(gains):+.4f}", *lines, sep="\n", flush=True)


if __name__ == "__main__":
    main()
