"""Weight sync: exact versions, deadlines, wrong versions, bounded retries, a second process,
and the LoRA adapter alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from lit_rlhf.generation.weight_sync import (
    FileWeightSync,
    InMemoryWeightSync,
    WeightSyncError,
    WeightSyncTimeout,
    WeightVersionError,
    load_weights,
    trained_weights,
)


def test_in_memory_sync_hands_out_exact_versions_with_deadlines():
    sync = InMemoryWeightSync()
    w = {"a": torch.zeros(2)}
    sync.publish(0, w)
    w["a"].add_(1)  # the learner keeps training: the published version is a copy
    assert torch.equal(sync.fetch(0, timeout=1)["a"], torch.zeros(2))
    with pytest.raises(WeightSyncTimeout, match="version 1 not published after"):
        sync.fetch(1, timeout=0.1)
    threading.Timer(0.05, sync.publish, args=(1, w)).start()
    assert torch.equal(sync.fetch(1, timeout=5)["a"], torch.ones(2))
    sync.publish(2, w)
    sync.publish(3, w)
    sync.fetch(3, timeout=1)
    with pytest.raises(WeightVersionError, match="version 2 asked for"):
        sync.fetch(2, timeout=1)  # replaced before it was fetched: an error, not the wrong weights
    with pytest.raises(WeightVersionError, match="must increase"):
        sync.publish(3, w)


def test_file_sync_checks_the_stamp_prunes_and_retries_a_bounded_number_of_times(tmp_path):
    sync = FileWeightSync(tmp_path, keep=2, retries=2)
    for v in range(3):
        sync.publish(v, {"a": torch.full((2,), float(v))})
    assert sync.versions() == [1, 2]
    assert torch.equal(sync.fetch(2, timeout=1)["a"], torch.full((2,), 2.0))
    with pytest.raises(WeightVersionError, match="pruned before it was fetched"):
        sync.fetch(0, timeout=1)
    sync.path(2).rename(sync.path(5))  # a file whose stamp says another version
    with pytest.raises(WeightVersionError, match="stamped version 2, expected 5"):
        sync.fetch(5, timeout=1)
    sync.path(6).write_bytes(b"not a safetensors file")
    started = time.perf_counter()
    with pytest.raises(WeightSyncError, match="after 2 tries"):
        sync.fetch(6, timeout=1)
    assert time.perf_counter() - started < 5
    with pytest.raises(WeightSyncTimeout, match="not published after"):
        sync.fetch(7, timeout=0.2)


def test_file_sync_between_two_processes(tmp_path):
    """Another process publishes versions 0..2 while this one fetches them in order."""
    code = textwrap.dedent(f"""
        import time, torch
        from lit_rlhf.generation.weight_sync import FileWeightSync
        sync = FileWeightSync({str(tmp_path)!r}, keep=3)
        print("imported", flush=True)
        for v in range(3):
            sync.publish(v, {{"w": torch.full((4, 4), float(v))}})
            time.sleep(0.2)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        # the deadlines are for the transfers, not for the other process's imports (slow on a busy machine)
        assert proc.stdout.readline().strip() == "imported"
        sync = FileWeightSync(tmp_path, keep=3)
        for v in range(3):
            assert torch.equal(sync.fetch(v, timeout=120)["w"], torch.full((4, 4), float(v)))
    finally:
        proc.wait(timeout=120)
    assert proc.returncode == 0


def test_lora_policies_send_the_adapter_only_and_weights_must_fit(tiny_model):
    from lit_rlhf.models import adapters

    full = trained_weights(tiny_model)
    assert set(full) == {n for n, _ in tiny_model.named_parameters()}
    lora = adapters.add_lora(tiny_model, adapters.lora_config({"r": 2, "alpha": 4}))
    sent = trained_weights(lora)
    assert sent and set(sent) == {n for n, _ in adapters.adapter_parameters(lora, adapters.POLICY)}
    assert not any("base_layer" in n or "embed_tokens" in n for n in sent)  # the frozen base stays
    load_weights(lora, {n: t + 1 for n, t in sent.items()})
    with pytest.raises(WeightSyncError, match="unknown names"):
        load_weights(lora, {"nope": torch.zeros(1)})
    name = next(iter(sent))
    with pytest.raises(WeightSyncError, match="shape mismatches"):
        load_weights(lora, {name: torch.zeros(1)})
