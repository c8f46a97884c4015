"""The `vllm_server` generation backend: a vLLM engine in its own process (OpenAI-compatible
server), sampling the asynchronous rollouts while the trainer trains.

**Starting it.** The trainer starts it (`VLLMServer.start`, from a checkpoint of the policy as it
is at the start of the fit) and stops it at the end; or it attaches to one already running
(`server_url`), started with one command, e.g. on its own GPU of the node:

    CUDA_VISIBLE_DEVICES=1 python -m lit_rlhf.generation.server --model checkpoints/sft_export \\
        --port 8000 [--lora-rank 16] [--nccl] [any `vllm serve` flag ...]

which runs `vllm.entrypoints.openai.api_server` with what the trainer needs (`server_command`):
the sampled token's log-prob of the distribution sampled (`--logprobs-mode processed_logprobs`),
no generation-config defaults, the weight receiver (`lit_rlhf.generation.server_worker`) and, on
CPU, vLLM's CPU settings (as the colocated engine, `lit_rlhf.generation.vllm`).

**Sampling.** `ServerClient.generate` sends one `/v1/completions` request per row (token ids
in, token ids and log-probs out; each row its own seed, so a prompt's G copies differ), several
at a time, and hands the tokens to the post-processing every backend shares (`finish_responses`,
D23). **Weights.** A version reaches the server as a safetensors file stamped with it
(`weight_sync.FileWeightSync`), loaded in place by the worker (`/collective_rpc`), then recorded
as the server's weight version (`/update_weight_version`, read back from `/weight_info`) and, with a
probe (`sync_check.SyncProbe`), checked: the server scores the probe's tokens (prompt log-probs)
against the trainer's (`ServerClient.check_probe`). A LoRA
policy sends its adapter only: the server runs the frozen base with vLLM's LoRA serving and each
version is a LoRA adapter of its own (`/v1/load_lora_adapter`; the previous one is unloaded). On
GPUs the NCCL path (`server_nccl`) broadcasts the tensors instead of writing files.

**Deadlines.** Every HTTP call has a timeout; a connection error is retried a bounded number of
times (`retries`); a server process that exited is named with its exit code and the end of its
log; a wrong version is an error (`weight_sync.WeightVersionError`). Nothing waits forever.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lit_rlhf.generation.config import SamplingConfig, check_prompts, finish_responses
from lit_rlhf.generation.weight_sync import WeightSyncTimeout, WeightVersionError

log = logging.getLogger(__name__)

CPU_ENV = {
    # one process (the engine core in the API server's, the worker in the engine's: `uni`), not
    # three: each imports vLLM, ~50 s apiece on a small CPU; measured 55 s to /health vs 147 s
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # share the cores with the trainer
}
SERVER_ENV = {
    "VLLM_SERVER_DEV_MODE": "1",  # opens /collective_rpc, through which the worker loads weights
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",  # /v1/load_lora_adapter (LoRA policies)
}
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # what vLLM's --max-lora-rank accepts


class ServerError(RuntimeError):
    """The vLLM server failed, exited or answered with an error."""


def server_env() -> dict[str, str]:
    """The server's environment: this one, `SERVER_ENV`, the CPU settings without a GPU (unless
    set already), `CUDA_VISIBLE_DEVICES` from `LIT_RLHF_SERVER_DEVICES` when that is set (a server
    the trainer starts on GPUs of its own), and this checkout on the path (the worker imports the
    weight receiver)."""
    env = {**os.environ, **SERVER_ENV}
    if not torch.cuda.is_available():
        env = {**CPU_ENV, **env}
    if os.environ.get("LIT_RLHF_SERVER_DEVICES"):  # the server's own GPUs, e.g. "1" next to a trainer on "0"
        env["CUDA_VISIBLE_DEVICES"] = os.environ["LIT_RLHF_SERVER_DEVICES"]
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(model: str, port: int, host: str = "127.0.0.1", lora_rank: int | None = None,
                   nccl: bool = False, on_cpu: bool | None = None, **engine_args: Any) -> list[str]:
    """The command line of a server the trainer can use: `vllm.entrypoints.openai.api_server`
    with the flags the module docstring lists; `engine_args` become flags (`max_model_len=256`
    -> `--max-model-len 256`; True -> the bare flag)."""
    on_cpu = not torch.cuda.is_available() if on_cpu is None else on_cpu
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", host,
           "--port", str(port), "--seed", "0", "--generation-config", "vllm", "--logprobs-mode", "processed_logprobs",
           "--no-enable-prefix-caching", "--worker-extension-cls", "lit_rlhf.generation.server_worker.WeightReceiver"]
    if on_cpu:
        cmd += ["--enforce-eager", "--distributed-executor-backend", "uni"]
    if lora_rank is not None:
        rank = next((r for r in LORA_RANKS if r >= lora_rank), None)
        if rank is None:
            raise ValueError(f"vLLM serves LoRA ranks up to {LORA_RANKS[-1]}, got {lora_rank}")
        cmd += ["--enable-lora", "--max-lora-rank", str(rank)]
    if nccl:
        cmd += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value is not False and value is not None:
            cmd += [flag, str(value)]
    return cmd


class VLLMServer:
    """A server process the trainer started (`start`), or one it attaches to (`process` None).

    Args:
        url: e.g. `http://127.0.0.1:8000`.
        process: the server process when this object started it (it stops it).
        log_path: the server's stdout and stderr.
    """

    def __init__(self, url: str, process: subprocess.Popen | None = None, log_path: Path | None = None) -> None:
        self.url, self.process, self.log_path = url.rstrip("/"), process, log_path
        self.workdir: Any = None  # e.g. the TemporaryDirectory of the model it was started from

    @classmethod
    def start(cls, model: str, log_path: str | Path, startup_timeout: float = 600.0, lora_rank: int | None = None,
              **engine_args: Any) -> "VLLMServer":
        """Start a server for `model` (a Hugging Face directory with its tokenizer) on a free
        port and wait (at most `startup_timeout` seconds) until it answers `/health`."""
        port = free_port()
        env = server_env()
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            process = subprocess.Popen(server_command(model, port, lora_rank=lora_rank, **engine_args), env=env,
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        server = cls(f"http://127.0.0.1:{port}", process, log_path)
        try:
            server.wait_ready(startup_timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def check_alive(self) -> None:
        """Raise `ServerError` when the server process (if this object started it) has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise ServerError(f"the vLLM server exited with code {self.process.returncode}; the end of its log "
                              f"({self.log_path}):\n{self.log_tail()}")

    def wait_ready(self, timeout: float) -> None:
        import requests

        deadline = time.perf_counter() + timeout
        while True:
            self.check_alive()
            try:
                if requests.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.perf_counter() > deadline:
                raise ServerError(f"the vLLM server at {self.url} did not answer /health within {timeout:.0f} s; "
                                  f"the end of its log:\n{self.log_tail()}")
            time.sleep(1.0)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server process this object started (SIGTERM to its process group, then SIGKILL)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            self.workdir = None
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self.workdir = None  # a TemporaryDirectory is removed when dropped


class ServerClient:
    """The trainer's calls to a server, each with a deadline (`timeout` seconds) and connection
    errors retried `retries` times.

    Args:
        server: the server (its process, when known, is checked after a failed call).
        model: the served model's name (the `--model` it was started with).
        timeout: seconds per HTTP call.
        retries: tries of a call that fails to connect or times out.
        max_concurrency: completion requests in flight at once.
    """

    def __init__(self, server: VLLMServer, model: str, timeout: float = 600.0, retries: int = 3,
                 max_concurrency: int = 64) -> None:
        self.server, self.model, self.timeout, self.retries = server, model, timeout, retries
        self.max_concurrency = max_concurrency

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                timeout: float | None = None) -> Any:
        import requests

        timeout = self.timeout if timeout is None else timeout
        error: Exception | None = None
        for attempt in range(self.retries):
            try:
                response = requests.request(method, f"{self.server.url}{path}", json=body, timeout=timeout)
            except (requests.ConnectionError, requests.Timeout) as err:
                error = err
                self.server.check_alive()
                time.sleep(min(2.0 ** attempt, 5.0))
                continue
            if response.status_code >= 400:
                raise ServerError(f"{method} {path} -> HTTP {response.status_code}: {response.text[:500]}")
            if not response.content:
                return None
            try:
                return response.json()
            except ValueError:  # some routes answer in plain text (/v1/load_lora_adapter)
                return response.text
        self.server.check_alive()
        if isinstance(error, requests.Timeout):
            raise WeightSyncTimeout(f"{method} {path}: no answer from the vLLM server at {self.server.url} within "
                                    f"{timeout:.1f} s ({self.retries} tries)") from error
        raise ServerError(f"{method} {path}: the vLLM server at {self.server.url} cannot be reached after "
                          f"{self.retries} tries: {error!r}") from error

    def weight_version(self) -> str | None:
        return self.request("GET", "/weight_info").get("weight_version")

    def set_weight_version(self, version: int) -> None:
        """Record `version` as the server's weight version and read it back."""
        self.request("POST", "/update_weight_version", {"new_version": str(version)})
        got = self.weight_version()
        if got != str(version):
            raise WeightVersionError(f"the vLLM server reports weight version {got} after version {version} was set")

    def load_weights_file(self, path: str | Path, version: int) -> None:
        """Load a safetensors file stamped `version` in place (`server_worker.WeightReceiver`)."""
        try:
            out = self.request("POST", "/collective_rpc", {"method": "lit_rlhf_load_weights",
                                                           "kwargs": {"path": str(path), "version": str(version)},
                                                           "timeout": self.timeout})
        except ServerError as err:
            if "stamped version" in str(err):  # the worker refused a file of another version
                raise WeightVersionError(f"the vLLM server refused {path} as version {version}: {err}") from err
            if "timed out" in str(err):  # the server's own deadline for the load (`timeout`)
                raise WeightSyncTimeout(f"the vLLM server did not load version {version} within {self.timeout:.1f} s: "
                                        f"{err}") from err
            raise
        loaded = (out or {}).get("results") or []
        if not loaded or any(str(v) != str(version) for v in loaded):
            raise WeightVersionError(f"the vLLM server's workers loaded {loaded} when version {version} was sent")
        self.set_weight_version(version)

    def check_probe(self, probe, version: int, expected: Tensor, dtype: torch.dtype, model: str | None = None,
                    sync: str = "vLLM server sync") -> float:
        """The server's log-probs of `probe`'s last tokens (of `model`: a LoRA adapter's name; None:
        the served model) against the trainer's `expected` (n, tokens) for `version`
        (`sync_check.SyncProbe.check`: `SyncCheckError` naming `sync` above the bound)."""
        started, n, rows = time.perf_counter(), probe.tokens, probe.input_ids.tolist()
        answers = [self.request("POST", "/v1/completions", {"model": model or self.model, "prompt": row, "max_tokens": 1,
                                                            "temperature": 1.0, "prompt_logprobs": 0}) for row in rows]
        scored = torch.tensor([[a["choices"][0]["prompt_logprobs"][j][str(row[j])]["logprob"] for j in range(len(row) - n, len(row))]
                               for a, row in zip(answers, rows)])
        return probe.check(sync, version, expected, scored, dtype, started)

    def load_adapter(self, path: str | Path, name: str, previous: str | None = None) -> None:
        """Serve the LoRA adapter in `path` as model `name`, unloading `previous` first (it may be
        `name`), and replacing an adapter the server already serves as `name` (a run resumed
        against a server that outlived it, which refuses a second load of one name)."""
        if previous is not None:
            self.request("POST", "/v1/unload_lora_adapter", {"lora_name": previous})
        body = {"lora_name": name, "lora_path": str(path)}
        try:
            self.request("POST", "/v1/load_lora_adapter", body)
        except ServerError:
            if name not in {m["id"] for m in self.request("GET", "/v1/models").get("data", [])}:
                raise
            self.request("POST", "/v1/unload_lora_adapter", {"lora_name": name})
            self.request("POST", "/v1/load_lora_adapter", body)

    def completion_body(self, prompt: list[int], config: SamplingConfig, eos_token_id: int, seed: int,
                        model: str | None = None) -> dict[str, Any]:
        """One `/v1/completions` request: what `vllm.sampling_params` asks of the colocated engine."""
        greedy = not config.do_sample
        return {
            "model": model or self.model, "prompt": prompt, "n": 1, "max_tokens": config.max_new_tokens,
            "temperature": 0.0 if greedy else config.temperature, "top_k": 0 if greedy else config.top_k,
            "top_p": 1.0 if greedy else config.top_p, "seed": int(seed), "ignore_eos": True,
            "stop_token_ids": [eos_token_id], "logprobs": 0, "return_token_ids": True,
            "skip_special_tokens": False, "include_stop_str_in_output": True,
        }

    @torch.no_grad()
    def generate(self, prompt_ids: Tensor, prompt_mask: Tensor, config: SamplingConfig, eos_token_id: int,
                 pad_token_id: int, seeds: list[int], model: str | None = None,
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """As `lit_rlhf.generation.vllm.VLLMEngine.generate`: (response_ids (B, R), response_mask,
        has_eos, sampler_logps) for left-padded prompts (B, P), one seed per row."""
        check_prompts(prompt_mask, eos_token_id, pad_token_id)
        n, R = prompt_ids.shape[0], config.max_new_tokens
        if len(seeds) != n:
            raise ValueError(f"got {len(seeds)} seeds for {n} prompts")
        prompts = [ids[m].tolist() for ids, m in zip(prompt_ids.cpu(), prompt_mask.bool().cpu())]
        bodies = [self.completion_body(p, config, eos_token_id, s, model) for p, s in zip(prompts, seeds)]
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, n))) as pool:
            answers = list(pool.map(lambda body: self.request("POST", "/v1/completions", body), bodies))
        tokens = torch.full((n, R), pad_token_id, dtype=torch.long)
        sampler = torch.zeros((n, R), dtype=torch.float32)
        for i, answer in enumerate(answers):
            choice = answer["choices"][0]
            ids = list(choice.get("token_ids") or [])[:R]
            logps = list((choice.get("logprobs") or {}).get("token_logprobs") or [])[:len(ids)]
            if len(logps) != len(ids):
                raise ServerError(f"the server returned {len(ids)} tokens but {len(logps)} log-probs for row {i}")
            tokens[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            sampler[i, :len(ids)] = torch.tensor(logps, dtype=torch.float32)
        finished = finish_responses(tokens, R, eos_token_id, pad_token_id, sampler)  # the sampler's log-probs 0 past EOS
        return tuple(t.to(prompt_ids.device) for t in finished)


def main(argv: list[str] | None = None) -> None:
    """`python -m lit_rlhf.generation.server --model DIR [--port P] [--lora-rank R] [--nccl] [vllm flags]`."""
    parser = argparse.ArgumentParser(description="A vLLM server a lit_rlhf trainer can sample from (server_url)")
    parser.add_argument("--model", required=True, help="Hugging Face directory of the policy (its base for LoRA)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--lora-rank", type=int, default=None, help="serve LoRA adapters up to this rank")
    parser.add_argument("--nccl", action="store_true", help="receive weights over NCCL (GPUs, server_nccl)")
    args, extra = parser.parse_known_args(argv)
    cmd = server_command(args.model, args.port, args.host, args.lora_rank, args.nccl) + extra
    env = server_env()
    print(" ".join(cmd), flush=True)
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
