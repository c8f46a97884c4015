"""A worker process that runs tool calls for `ToolRunner`'s `process` isolation: started with
`spawn` (no copy of the trainer's threads or memory), it runs pickled `(function, kwargs)` requests
one at a time (tools must be module-level functions) and answers `("ok", result)` or `("raised",
message)`; one past its time limit is killed, and the next call starts a new one.
"""

from __future__ import annotations

import multiprocessing
from typing import Any, Callable


def _worker_loop(connection) -> None:  # pragma: no cover - runs in the worker process
    connection.send(("ready", None))
    while True:
        try:
            fn, kwargs = connection.recv()
        except EOFError:
            return
        try:
            connection.send(("ok", fn(**kwargs)))
        except BaseException as err:  # noqa: BLE001 - reported to the parent
            connection.send(("raised", f"{type(err).__name__}: {err}"))


class ProcessWorker:
    """One worker process running tool calls; killed and replaced when a call times out. A call's
    time limit counts from when the worker is up (starting one imports the tool's module)."""

    STARTUP_SECONDS = 120.0

    def __init__(self) -> None:
        self._process = None
        self._connection = None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        self._process = context.Process(target=_worker_loop, args=(child,), daemon=True)
        self._process.start()
        child.close()
        self._connection = parent
        if not parent.poll(self.STARTUP_SECONDS) or parent.recv()[0] != "ready":
            self.stop()
            raise RuntimeError(f"the tool worker process did not start within {self.STARTUP_SECONDS:g} s")

    def call(self, fn: Callable, kwargs: dict[str, Any], timeout: float) -> tuple[str, Any]:
        if self._process is None or not self._process.is_alive():
            try:
                self._start()
            except RuntimeError as err:
                return "raised", str(err)
        try:
            self._connection.send((fn, kwargs))
        except Exception as err:  # noqa: BLE001 - an unpicklable tool or argument
            return "raised", f"the call could not be sent to the tool process: {type(err).__name__}: {err}"
        if not self._connection.poll(timeout):
            self.stop()
            return "timeout", None
        try:
            return self._connection.recv()
        except Exception as err:  # noqa: BLE001 - an unpicklable result, a dead worker
            self.stop()
            return "bad_output", f"the tool's result could not be received: {type(err).__name__}: {err}"

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.join(timeout=5)
        self._process, self._connection = None, None
