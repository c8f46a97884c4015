"""Whether the Hugging Face hub can be used, decided once and fast, before anything retries.

Without network, `transformers` and `datasets` retry every hub request for about a minute.
`prepare_environment()` (called by the CLI before anything imports `huggingface_hub`) respects a
user's `HF_HUB_OFFLINE`; otherwise it tries one TCP connection to the hub's host (or the HTTPS
proxy) for `PROBE_TIMEOUT` seconds and on failure sets `HF_HUB_OFFLINE=1`, so later lookups answer
from the cache or fail at once. It also turns telemetry off unless the user set it.
`offline_reason()` says why the hub is not used (None when it is), for `lit_rlhf.models`' errors.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

PROBE_TIMEOUT = 1.5  # seconds
DEFAULT_ENDPOINT = "https://huggingface.co"
_probe_failure: str | None = None  # what the probe saw, when it switched offline mode on
_checked = False


def _probe_target() -> tuple[str, int]:
    """(host, port) a hub request would first connect to: the HTTPS proxy when one is set."""
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        if os.environ.get(var):
            proxy = urlparse(os.environ[var] if "://" in os.environ[var] else f"http://{os.environ[var]}")
            return proxy.hostname or "", proxy.port or 8080
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    return endpoint.hostname or "", endpoint.port or (443 if endpoint.scheme == "https" else 80)


def probe(timeout: float = PROBE_TIMEOUT) -> str | None:
    """None when a TCP connection to the hub (or the proxy) opens within `timeout`, else why not."""
    host, port = _probe_target()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as err:  # DNS failure, refused, unreachable, timed out
        return f"{host}:{port} is unreachable ({type(err).__name__}: {err})"


def prepare_environment(check_network: bool = True) -> None:
    """Telemetry off and offline mode decided; call before `huggingface_hub` / `datasets` import."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_UPDATE_DOWNLOAD_COUNTS", "0")
    if check_network:
        check_once()


def check_once() -> None:
    """Probe the hub once per process (unless the user set offline mode either way); when it is
    unreachable, switch offline mode on for this process."""
    global _checked, _probe_failure
    if _checked:
        return
    _checked = True
    if "HF_HUB_OFFLINE" in os.environ or "TRANSFORMERS_OFFLINE" in os.environ:
        return
    failure = probe()
    if failure is not None:
        _probe_failure = failure
        os.environ["HF_HUB_OFFLINE"] = "1"
        _set_imported_offline_flags()


def _set_imported_offline_flags() -> None:
    """Offline mode for libraries that read the environment at import and are already imported."""
    import sys

    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    config = sys.modules.get("datasets.config")
    if config is not None:
        config.HF_HUB_OFFLINE = config.HF_DATASETS_OFFLINE = True


def offline_reason() -> str | None:
    """Why hub lookups are off in this process, or None when the hub is used."""
    if _probe_failure is not None:
        return f"the Hugging Face hub is unreachable: {_probe_failure}; offline mode was switched on"
    from huggingface_hub import constants

    return "offline mode is set (HF_HUB_OFFLINE=1)" if constants.is_offline_mode() else None
