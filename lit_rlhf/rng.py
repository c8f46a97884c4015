"""Random generator states in checkpoints, so a resumed run samples what the straight run would.

Lightning checkpoints no random generator, yet sampling, minibatch shuffles and user code read
them. A module saves every rank's torch/numpy/`random` states (`save_states`, indexed by global
rank) and restores its own rank's when training starts (`pending_state` in
`on_load_checkpoint`, `restore_state` in `on_train_start`: after set-up, the sanity check and the
dataloaders, which may draw differently in a resumed run). The data order (`ResumableSampler`)
and evaluation (`validation_rng`, the judge callback's own seed) do not read these states.
"""

from __future__ import annotations

import os
import random
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch

RNG_KEY = "rng_states"


def capture_state() -> dict[str, Any]:
    """The generator states of this process: torch CPU and CUDA (every device), numpy, python."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": _numpy_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_state(state: dict[str, Any]) -> None:
    """Set this process's generators to `state` (from `capture_state`)."""
    torch.set_rng_state(state["torch"].cpu() if isinstance(state["torch"], torch.Tensor) else state["torch"])
    np.random.set_state(_numpy_tuple(state["numpy"]))
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            raise RuntimeError(
                f"the checkpoint holds CUDA generator states of {len(cuda)} devices, this process sees "
                f"{torch.cuda.device_count()}: resume on the same number of visible GPUs per process"
            )
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


def _numpy_state() -> dict[str, Any]:
    """numpy's legacy generator state as tensors and numbers (loadable with `weights_only=True`)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _numpy_tuple(state: dict[str, Any]) -> tuple:
    keys = state["keys"].cpu().numpy().astype(np.uint32)
    return state["name"], keys, state["pos"], state["has_gauss"], state["cached_gaussian"]


def save_states(checkpoint: dict[str, Any], trainer: Any = None) -> None:
    """Store every rank's generator states in `checkpoint[RNG_KEY]` (a list indexed by rank).

    Lightning calls `on_save_checkpoint` on every rank, so with several processes this gathers
    (a collective: every rank must call it, as checkpointing does).
    """
    states = [capture_state()]
    world = getattr(trainer, "world_size", 1) if trainer is not None else 1
    if world > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, states[0])
        states = gathered
    checkpoint[RNG_KEY] = states


def pending_state(checkpoint: dict[str, Any], trainer: Any = None) -> dict[str, Any] | None:
    """This rank's saved generator states (None when the checkpoint has none).

    A checkpoint written by W processes restores on W processes; with another count the states
    cannot match the straight run anyway, and every rank takes state `rank % W`.
    """
    states = checkpoint.get(RNG_KEY)
    if not states:
        return None
    rank = getattr(trainer, "global_rank", 0) if trainer is not None else 0
    return states[rank % len(states)]


@contextmanager
def validation_rng(device: torch.device, step: int, batch_idx: int) -> Iterator[None]:
    """Fork the torch generators (CPU, and `device` when it is a GPU) and seed them from the run's
    seed (`PL_GLOBAL_SEED`, set by `seed_everything`), `step` and `batch_idx`; the global state
    is restored on exit."""
    seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
    fork = torch.random.fork_rng(devices=[device], device_type="cuda") if device.type == "cuda" else \
        torch.random.fork_rng(devices=[])
    with fork:
        torch.manual_seed((seed * 1_000_003 + step * 10_007 + batch_idx) % (2**63))
        yield
