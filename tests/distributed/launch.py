"""Run a script in N CPU processes (gloo), as torchrun would, with a hard timeout.

Each process gets MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK/LOCAL_RANK/NODE_RANK, so Lightning
sees processes created externally (LightningEnvironment) and does not relaunch anything. On a
timeout or a failed rank every process of the run is killed (a hang under ZeRO-3 can never
block CI) and the error carries each rank's output tail.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script: str | Path, args: list[str], nprocs: int, out_dir: Path, timeout: float) -> list[dict]:
    """Run `python script *args --out out_dir` in `nprocs` ranks; return each rank's `rank{r}.json`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs, logs = [], []
    for rank in range(nprocs):
        env = dict(
            os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nprocs), RANK=str(rank),
            LOCAL_RANK=str(rank), NODE_RANK="0", LOCAL_WORLD_SIZE=str(nprocs), OMP_NUM_THREADS="1",
            TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", DS_ACCELERATOR="cpu",
            PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        )
        log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, str(script), *args, "--out", str(out_dir)]
        procs.append(subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        logs.append(log)
    deadline = time.monotonic() + timeout
    failure = None
    while any(p.poll() is None for p in procs):
        if time.monotonic() > deadline:
            failure = f"timed out after {timeout:.0f} s (a hang: e.g. ranks running different numbers of collectives)"
            break
        if any(p.poll() not in (None, 0) for p in procs):
            time.sleep(2)  # let the other ranks print their side of the error
            failure = "a rank failed"
            break
        time.sleep(0.2)
    for p in procs:  # never leave a rank behind
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if failure is None and any(p.returncode != 0 for p in procs):
        failure = "a rank failed"
    if failure:
        tails = []
        for rank, (p, log) in enumerate(zip(procs, logs)):
            log.seek(0)
            tails.append(f"--- rank {rank} (exit {p.returncode}) ---\n{log.read()[-4000:]}")
        raise RuntimeError(f"{Path(script).name} {' '.join(args)}: {failure}\n" + "\n".join(tails))
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(nprocs)]
