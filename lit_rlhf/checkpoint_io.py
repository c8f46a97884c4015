"""Atomic checkpoint files: a kill during a save never leaves a truncated `last.ckpt`
(`docs/guides/resume.md`).

Lightning's `TorchCheckpointIO` writes to a temporary file in `$TMPDIR` and `shutil.move`s it,
which copies INTO the destination across filesystems (local /tmp, checkpoints on NFS): a kill
then truncates the previous checkpoint (`tests/test_atomic_checkpoint.py`). `AtomicCheckpointIO`
writes a temporary file in the destination directory, fsyncs it, `os.replace`s it and fsyncs the
directory, keeping the umask's mode; a killed save's temporaries go on the target's next save
(`remove_stale_temporaries`); remote URLs go through Lightning's. `allow_hparam_globals` lets
`weights_only=True` loading accept exactly the classes and functions the run's own config
instantiated (e.g. `reward_fns`). Every lit_rlhf module installs it in `setup()` over Lightning's
default (`install_atomic_checkpoint_io`), or name it in `trainer.plugins`.
"""

from __future__ import annotations

import inspect
import logging
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

log = logging.getLogger(__name__)


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """`torch.save(obj, path)` through a same-directory temporary file
    (`.<name>.<host>.<pid>.<random>.tmp`) and an atomic rename (module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = path.parent / f".{path.name}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for torch.save
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


_HOST = socket.gethostname().replace(".", "_") or "host"
STALE_AFTER_S = 3600.0  # a temporary of another host untouched this long is not being written


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of `path` that no live process is writing; returns them.

    A temporary made on this host belongs to the process whose pid is in its name: it is stale
    when that process no longer exists (and is not this one). One from another host (a shared
    filesystem), or in another naming, is stale when it was not modified for `STALE_AFTER_S`.
    """
    path = Path(path)
    removed = []
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        parts = tmp.name[len(path.name) + 2: -len(".tmp")].split(".")
        try:
            if len(parts) == 3 and parts[0] == _HOST and parts[1].isdigit():
                pid = int(parts[1])
                stale = pid != os.getpid() and not _pid_alive(pid)
            else:
                stale = time.time() - tmp.stat().st_mtime > STALE_AFTER_S
            if stale:
                tmp.unlink()
                removed.append(tmp)
        except FileNotFoundError:  # removed meanwhile (renamed into place, or by another cleaner)
            continue
    if removed:
        log.warning("removed %d stale temporary checkpoint file(s) of %s left by killed saves: %s", len(removed), path,
                    [p.name for p in removed])
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicCheckpointIO(TorchCheckpointIO):
    """`TorchCheckpointIO` whose local saves are atomic (temporary file + fsync + rename)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError(
                f"`Trainer.save_checkpoint(..., storage_options=...)` with `{type(self).__name__}` is not supported: "
                "it writes local files only"
            )
        if "://" in str(path) and not str(path).startswith("file://"):
            super().save_checkpoint(checkpoint, path, storage_options)  # remote: Lightning's fsspec path
            return
        atomic_torch_save(checkpoint, str(path).removeprefix("file://"))


_PLAIN = (str, int, float, bool, bytes, type(None), torch.Tensor, torch.dtype, torch.device)
_CONTAINERS = (dict, list, tuple, set, frozenset)


def hparam_globals(value: Any) -> list[Any]:
    """The classes / functions an unpickler needs for `value` (hyper-parameters), recursively."""
    found: list[Any] = []

    def visit(v: Any) -> None:
        if isinstance(v, _PLAIN):
            return
        if isinstance(v, _CONTAINERS):
            for item in v.values() if isinstance(v, dict) else v:
                visit(item)
            if type(v) not in _CONTAINERS:  # a subclass (an OrderedDict, a NamedTuple) needs its class
                found.append(type(v))
        elif inspect.isfunction(v) or inspect.isclass(v) or inspect.isbuiltin(v):
            found.append(v)
        else:
            found.append(type(v))
            visit(getattr(v, "__dict__", {}))

    visit(value)
    return list(dict.fromkeys(found))


def allow_hparam_globals(hparams: Any) -> None:
    """Allow-list, for `weights_only` checkpoint loading, the objects this run's hyper-parameters hold."""
    extra = hparam_globals(dict(hparams))
    if extra:
        torch.serialization.add_safe_globals(extra)


def install_atomic_checkpoint_io(trainer: Any) -> bool:
    """Use `AtomicCheckpointIO` when the trainer's strategy has Lightning's default checkpoint IO.

    Returns True when it was installed (or already there). A strategy with its own saving
    (DeepSpeed writes a directory of shards) or a user-chosen CheckpointIO is left alone.
    """
    strategy = getattr(trainer, "strategy", None)
    if strategy is None or not hasattr(strategy, "checkpoint_io"):
        return False
    current = strategy.checkpoint_io
    if isinstance(current, AtomicCheckpointIO):
        return True
    if type(current) is not TorchCheckpointIO:
        return False
    strategy.checkpoint_io = AtomicCheckpointIO()
    return True
