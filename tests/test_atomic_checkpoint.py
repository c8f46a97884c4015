"""Checkpoints are written atomically: a process killed while saving leaves the previous file intact.

1. A subprocess saves a ~32 MB checkpoint in a loop through `AtomicCheckpointIO` and is SIGKILLed
   at a random moment after its first save (twice, and again until a kill lands inside a write,
   at most 8 times); the file is then always a complete,
   loadable checkpoint of one of the saves, and the temporary file of the interrupted save
   shows the kill did land during a write.
2. Why Lightning's own `TorchCheckpointIO` is not enough: its fsspec transaction writes to
   `$TMPDIR` and moves the file; across filesystems (`rename` fails with EXDEV, the usual case of
   a local /tmp and checkpoints on a network or mounted volume) the move copies into the
   destination path, and a death during that copy truncates the previous checkpoint. Simulated
   deterministically here; `AtomicCheckpointIO` survives the same failure.
3. Every lit_rlhf module installs `AtomicCheckpointIO` when a fit starts.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from lit_rlhf.checkpoint_io import AtomicCheckpointIO

REPO = Path(__file__).resolve().parent.parent

WRITER = textwrap.dedent("""
    import sys, time, torch
    from pathlib import Path
    from lit_rlhf.checkpoint_io import AtomicCheckpointIO

    path, marker = Path(sys.argv[1]), Path(sys.argv[2])
    io = AtomicCheckpointIO()
    weights = torch.zeros(8 * 1024 * 1024)  # 32 MB of float32
    k = 0
    while True:
        k += 1
        weights.fill_(float(k))
        io.save_checkpoint({"step": k, "state_dict": {"w": weights}}, path)
        marker.write_text(str(k))
""")


def payload(step: int) -> dict:
    return {"step": step, "state_dict": {"w": torch.full((1000,), float(step))}}


def assert_complete(path: Path) -> int:
    ckpt = torch.load(path, weights_only=True)
    step = ckpt["step"]
    assert torch.equal(ckpt["state_dict"]["w"], torch.full_like(ckpt["state_dict"]["w"], float(step)))
    return step


def test_sigkill_during_saves_leaves_a_complete_checkpoint(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    rng = random.Random(0)
    interrupted_writes = 0
    for trial in range(8):  # at least 2 kills, more until one lands inside a write (timing varies with load)
        if trial >= 2 and interrupted_writes:
            break
        ckpt, marker = tmp_path / f"run{trial}" / "last.ckpt", tmp_path / f"marker{trial}"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, str(script), str(ckpt), str(marker)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while not marker.exists():  # wait for the first complete save
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "the writer never finished a save"
                time.sleep(0.01)
            time.sleep(rng.uniform(0.05, 0.6))  # then kill it at a random moment of its save loop
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stderr.close()
        step = assert_complete(ckpt)
        assert step >= int(marker.read_text() or 1)
        leftovers = [p for p in ckpt.parent.iterdir() if p.name != "last.ckpt"]
        assert all(p.name.startswith(".last.ckpt.") and p.name.endswith(".tmp") for p in leftovers), leftovers
        interrupted_writes += bool(leftovers)
    assert interrupted_writes >= 1, "no kill landed during a write: the test did not test anything"


def _die_halfway(src, dst, length=0):
    """shutil's copy loop, killed after half the bytes (what SIGKILL during the copy does)."""
    data = src.read()
    dst.write(data[: len(data) // 2])
    dst.flush()
    raise KeyboardInterrupt("killed during the copy")


def _cross_device(*args, **kwargs):
    raise OSError(errno.EXDEV, "Invalid cross-device link")


@pytest.mark.parametrize("io_class, survives", [(TorchCheckpointIO, False), (AtomicCheckpointIO, True)])
def test_death_during_a_cross_filesystem_save(io_class, survives, tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    io = io_class()
    io.save_checkpoint(payload(1), path)
    with monkeypatch.context() as m:
        m.setattr(os, "rename", _cross_device)  # $TMPDIR on another filesystem: shutil.move copies
        m.setattr(shutil, "copyfileobj", _die_halfway)
        m.setattr(shutil, "_fastcopy_sendfile", _die_halfway_sendfile, raising=False)
        with pytest.raises(KeyboardInterrupt):
            io.save_checkpoint(payload(2), path)
            raise KeyboardInterrupt("the atomic save does not copy: simulate the death after it")
    if survives:
        assert assert_complete(path) in (1, 2)
    else:
        with pytest.raises(Exception):
            assert_complete(path)  # the previous checkpoint is gone: a truncated file in its place


def _die_halfway_sendfile(fsrc, fdst):
    _die_halfway(fsrc, fdst)


def test_modules_install_atomic_checkpoint_io(tmp_path):
    import lightning as L

    from lit_rlhf.data import TLDRSFTDataModule
    from lit_rlhf.modules import SFTModule

    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, limit_val_batches=0)
    dm = TLDRSFTDataModule("bundled:tldr_sft", "tiny-random-llama", max_prompt_length=96, max_completion_length=256,
                           limit=2, batch_size=2, val_split=None, test_split=None)
    trainer.fit(SFTModule(model="tiny-random-llama"), datamodule=dm)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    saved = list((tmp_path / "checkpoints").glob("*.ckpt"))
    assert saved and torch.load(saved[0], weights_only=True)["global_step"] == 1
