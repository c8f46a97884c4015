"""Shared fixtures: the tiny model, its tokenizer, and paths to the shared real data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("LIT_RLHF_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
TLDR_COMPARISONS_SAMPLE = SHARED_DATA / "tldr" / "comparisons.sample.jsonl"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist (the README's `-n 2`) each worker owns its share of the cores: torch in the
# worker, and in every process a test starts (OMP_NUM_THREADS is inherited), runs at most that many
# threads, whatever a test asks for. Two workers that each spin two OpenMP threads on two cores
# run several times slower than one thread each.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    import torch

    THREAD_SHARE = max(1, (os.cpu_count() or 1) // _WORKERS)
    os.environ["OMP_NUM_THREADS"] = str(THREAD_SHARE)
    _set_num_threads = torch.set_num_threads

    def _capped_set_num_threads(n: int) -> None:
        _set_num_threads(min(int(n), THREAD_SHARE))

    torch.set_num_threads = _capped_set_num_threads
    _set_num_threads(THREAD_SHARE)


@pytest.fixture(autouse=True)
def sigterm_handler_restored():
    """After each test, the SIGTERM handler from before it: a fit through the CLI in the test process
    leaves `PreemptionCheckpoint`'s handler in place for the rest of the process (`hold_until_exit`)."""
    import signal

    before = signal.getsignal(signal.SIGTERM)
    yield
    if signal.getsignal(signal.SIGTERM) != before:
        signal.signal(signal.SIGTERM, before)


@pytest.fixture()
def one_thread():
    """torch on one thread for the test: bitwise-reproducible CPU kernels, and much faster when
    the CPU is shared. A test module opts in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from lit_rlhf.models import load_tokenizer

    return load_tokenizer("tiny-random-llama")


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (read from the embedded GGUF once per session)."""
    from lit_rlhf.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture()
def tiny_model(tiny_tokenizer):
    from lit_rlhf.models import load_causal_lm

    return load_causal_lm("tiny-random-llama", tiny_tokenizer)


@pytest.fixture(scope="session")
def tldr_comparisons_sample() -> Path:
    if not TLDR_COMPARISONS_SAMPLE.is_file():
        raise FileNotFoundError(
            f"the shared TL;DR sample is missing at {TLDR_COMPARISONS_SAMPLE}; "
            "set LIT_RLHF_SHARED_DATA to the shared/data directory"
        )
    return TLDR_COMPARISONS_SAMPLE


@pytest.fixture(autouse=True)
def project_loggers_propagate():
    """Each test starts with the project's loggers as a library leaves them: propagating to the
    root (where pytest's caplog listens), with no handler of their own. `lit_rlhf.cli.run` (like
    `main.py`) gives them a stderr handler and stops propagation for the rest of the process."""
    import logging

    for name in ("lit_rlhf", "callbacks"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [h for h in logger.handlers if not getattr(h, "_lit_rlhf", False)]
        logger.propagate = True
    # `lit_rlhf.console.configure` (run by an in-process CLI run) also drops some messages of the
    # project's own module loggers from the console (`LOG_FILTERS`): a later test's caplog must see them
    from lit_rlhf.console import DropMessages

    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith(("lit_rlhf.", "callbacks.")) and isinstance(logger, logging.Logger):
            logger.filters[:] = [f for f in logger.filters if not isinstance(f, DropMessages)]
    yield


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`, the README's command) the vLLM tests share one
    worker: they share one engine per session (tests/vllm/conftest.py), so one worker builds it
    once. They are collected first, so that worker starts on them while the other takes the rest,
    instead of running them alone at the end."""
    vllm_dir = str(Path(__file__).resolve().parent / "vllm")
    vllm = [item for item in items if str(item.fspath).startswith(vllm_dir)]
    for item in vllm:
        item.add_marker(pytest.mark.xdist_group("vllm"))
    items[:] = vllm + [item for item in items if not str(item.fspath).startswith(vllm_dir)]
