"""Checkpoint files: the umask's mode, and temporaries of killed saves cleaned on the next save."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import torch

from lit_rlhf import checkpoint_io
from lit_rlhf.checkpoint_io import atomic_torch_save, remove_stale_temporaries
from tests.helpers import REPO_ROOT, subprocess_env


def test_checkpoint_keeps_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_torch_save({"x": torch.ones(2)}, tmp_path / "a.ckpt")
        os.umask(0o007)
        atomic_torch_save({"x": torch.ones(2)}, tmp_path / "b.ckpt")
    finally:
        os.umask(old)
    assert (tmp_path / "a.ckpt").stat().st_mode & 0o777 == 0o644  # what torch.save gives
    assert (tmp_path / "b.ckpt").stat().st_mode & 0o777 == 0o660


def test_stale_temporaries_are_removed_but_not_a_live_writers(tmp_path):
    target = tmp_path / "last.ckpt"
    host = checkpoint_io._HOST
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    stale = tmp_path / f".last.ckpt.{host}.{dead.pid}.abcd.tmp"
    live = tmp_path / f".last.ckpt.{host}.{os.getppid()}.abcd.tmp"  # a running process is writing it
    other_host_recent = tmp_path / ".last.ckpt.otherhost.123.abcd.tmp"
    other_host_old = tmp_path / ".last.ckpt.otherhost.456.abcd.tmp"
    other_target = tmp_path / f".epoch=0.ckpt.{host}.{dead.pid}.abcd.tmp"  # another checkpoint's: not ours to judge
    for path in (stale, live, other_host_recent, other_host_old, other_target):
        path.write_bytes(b"partial")
    hour_ago = time.time() - checkpoint_io.STALE_AFTER_S - 60
    os.utime(other_host_old, (hour_ago, hour_ago))

    atomic_torch_save({"step": 2}, target)

    assert torch.load(target)["step"] == 2
    assert not stale.exists() and not other_host_old.exists()
    assert live.exists() and other_host_recent.exists() and other_target.exists()
    assert remove_stale_temporaries(target) == []


KILL_DURING_SAVE = """
import os, signal, sys, torch
from lit_rlhf import checkpoint_io
checkpoint_io.atomic_torch_save({"step": 1}, sys.argv[1])
checkpoint_io.os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # killed between write and rename
checkpoint_io.atomic_torch_save({"step": 2}, sys.argv[1])
"""


def test_a_save_killed_midway_keeps_the_previous_file_and_its_temporary_goes_next_time(tmp_path):
    target = tmp_path / "last.ckpt"
    done = subprocess.run([sys.executable, "-c", KILL_DURING_SAVE, str(target)], cwd=REPO_ROOT, env=subprocess_env(),
                          capture_output=True, timeout=120)
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    leftovers = list(tmp_path.glob(".last.ckpt.*.tmp"))
    assert len(leftovers) == 1 and socket.gethostname().replace(".", "_") in leftovers[0].name
    assert torch.load(target)["step"] == 1  # the previous checkpoint, intact
    atomic_torch_save({"step": 3}, target)
    assert torch.load(target)["step"] == 3 and not list(tmp_path.glob(".last.ckpt.*.tmp"))
