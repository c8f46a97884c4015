"""Several vLLM engines in one process: the distributed state they share outlives all but the last.

Every in-process engine core (the CPU default, `VLLM_ENABLE_V1_MULTIPROCESSING=0`) reuses vLLM's
process-wide distributed state, and vLLM tears it down when any core shuts down
(`EngineCore.shutdown` -> `cleanup_dist_env_and_memory`), breaking the others ("pipeline model
parallel group is not initialized"), e.g. a training engine beside `judge_policy`'s.
`share_distributed_state(llm)` registers a core so that its shutdown leaves the state to the last
live registered one; an engine whose core runs in its own process is left as it is.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

_LIVE_CORES: set[int] = set()  # id() of every registered in-process engine core not yet shut down


def live_in_process_engines() -> int:
    """How many registered in-process engine cores have not shut down."""
    return len(_LIVE_CORES)


def share_distributed_state(llm: Any) -> bool:
    """Make the in-process core of the `vllm.LLM` `llm` leave the shared distributed state to
    the last live core when it shuts down. Returns whether `llm`'s core runs in this process."""
    client = llm.llm_engine.engine_core  # vLLM's in-process client holds the core itself
    core = getattr(client, "engine_core", None)
    finalizer = getattr(client, "_finalizer", None)
    if core is None or not isinstance(finalizer, weakref.finalize) or not finalizer.alive:
        return False
    finalizer.detach()  # vLLM's: shut the core down when the client is collected
    key = id(core)
    _LIVE_CORES.add(key)
    core.shutdown = _last_tears_down(core.shutdown, key)
    # the explicit path (`client.shutdown()`) and collection both reach the wrapped shutdown,
    # once: the client calls `engine_core.shutdown()` only if this finalizer was still alive
    client._finalizer = weakref.finalize(client, core.shutdown)
    return True


def _last_tears_down(shutdown: Callable[[], None], key: int) -> Callable[[], None]:
    def shutdown_core() -> None:
        _LIVE_CORES.discard(key)
        if not _LIVE_CORES:  # the last one: vLLM's full teardown
            shutdown()
            return
        from vllm.v1.engine import core as core_module

        teardown = core_module.cleanup_dist_env_and_memory
        core_module.cleanup_dist_env_and_memory = _keep_distributed_state
        try:
            shutdown()
        finally:
            core_module.cleanup_dist_env_and_memory = teardown

    return shutdown_core


def _keep_distributed_state(*args: Any, **kwargs: Any) -> None:
    """Stands for `cleanup_dist_env_and_memory` while other in-process engines still use the state."""
