"""Weight sync to a vLLM server over NCCL (GPUs): `weight_transfer: nccl`.

On a GPU node the engine runs on its own GPU(s) and the trainer's GPU broadcasts each version's
tensors to the engine's workers over NCCL, through vLLM's weight-transfer API
(`vllm.distributed.weight_transfer`): the trainer is rank 0 of a group with the server's workers
(ranks 1 ..), set up once by a rendezvous (`/init_weight_transfer_engine`, driven by vLLM's
`NCCLTrainerWeightTransferEngine` over the server's HTTP routes); each version is then one round
of `/start_weight_update`, `/update_weights` (the workers receive while the trainer broadcasts)
and `/finish_weight_update`, after which `/update_weight_version` records the version and
`/weight_info` confirms it (`ServerClient.set_weight_version`).

The server must be started for it: `python -m lit_rlhf.generation.server --model DIR --nccl`
(`--weight-transfer-config '{"backend": "nccl"}'`), or by the trainer with `weight_transfer: nccl`.
The trainer's address as the server's workers reach it is `LIT_RLHF_WEIGHT_SYNC_ADDR` (default
127.0.0.1: engine and trainer on one node), its port a free one.

**Deadlines.** An NCCL call that never meets its peer blocks forever, so every step runs in a
helper thread joined with a deadline (`with_deadline`): a rendezvous or a transfer that does not
finish in time raises `WeightSyncTimeout` (the group is unusable after that; the run stops, and
a resumed run sets up a new one), and an error on the server side (an HTTP error, a dead server)
is raised as it comes. A LoRA policy keeps to the file path (its adapter is small).

Not run on this project's CPU test machine (it needs CUDA and the CUDA build of vLLM).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Iterator, TypeVar

from torch import Tensor

from lit_rlhf.generation.server import ServerClient, free_port
from lit_rlhf.generation.weight_sync import WeightSyncTimeout

T = TypeVar("T")


def with_deadline(fn: Callable[[], T], timeout: float, what: str) -> T:
    """`fn()` in a daemon thread, waited for at most `timeout` seconds (`WeightSyncTimeout` after
    that, naming `what`); its exception is raised here."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - raised in the caller
            out["error"] = err

    thread = threading.Thread(target=run, name=f"lit_rlhf-{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise WeightSyncTimeout(f"{what} did not finish within {timeout:.0f} s (the NCCL group is unusable now)")
    if "error" in out:
        raise out["error"]
    return out["value"]


def tensor_source(tensors_of: Callable[[], dict[str, Tensor]]):
    """A vLLM `WeightSource` over the tensors `tensors_of()` returns (the version being sent)."""
    import torch
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class TensorSource(WeightSource):
        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in tensors_of().items()]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            yield from tensors_of().items()

    return TensorSource()


class NCCLWeightSender:
    """Sends weight versions to a vLLM server started with the NCCL weight transfer.

    Args:
        client: the server's client (its `timeout` is each HTTP call's).
        timeout: seconds for the rendezvous and for each version's transfer.
        address: the trainer's address as the server's workers reach it.
    """

    def __init__(self, client: ServerClient, timeout: float = 600.0, address: str | None = None) -> None:
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        self.client, self.timeout = client, timeout
        self._tensors: dict[str, Tensor] = {}
        workers = int(client.request("GET", "/get_world_size")["world_size"])
        init = NCCLTrainerInitInfo(master_address=address or os.environ.get("LIT_RLHF_WEIGHT_SYNC_ADDR", "127.0.0.1"),
                                   master_port=free_port(), world_size=workers + 1)
        http = HTTPVLLMWeightSyncClient(client.server.url, timeout=client.timeout)
        source = tensor_source(lambda: self._tensors)
        self.engine = with_deadline(
            lambda: WeightTransferTrainerFactory.trainer_init(init, client=http, source=source), timeout,
            "NCCL weight-transfer rendezvous")

    def push(self, version: int, tensors: dict[str, Tensor]) -> None:
        """Broadcast `tensors` (on this process's GPU) as `version` and record it on the server."""
        self.client.server.check_alive()
        self._tensors = tensors
        try:
            with_deadline(self.engine.send_weights, self.timeout, f"NCCL transfer of weight version {version}")
        finally:
            self._tensors = {}
        self.client.set_weight_version(version)

    def close(self) -> None:
        self.engine.shutdown()
