"""The sampler with a preallocated cache and compaction of finished rows draws exactly the tokens
(and log-probs, and leaves the random stream exactly where) the previous sampling loop did
(`benchmarks/previous_sampler.py`, kept verbatim): several seeds, temperature / top-k / top-p
and greedy, left-padded prompts of different lengths, repeated prompts, rows that finish early."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.previous_sampler import previous_sample_tokens
from lit_rlhf.generation import (
    SamplingConfig,
    finish_responses,
    generate_responses,
    sample_tokens,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PAD, EOS = 0, 1


def small_vocab_lm(sliding_window: int | None = None):
    """A 2-layer Llama (or Mistral, with a sliding window) of 24 tokens: EOS is drawn often, so
    rows finish at different steps."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
    )

    torch.manual_seed(0)
    common = {"vocab_size": 24, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "max_position_embeddings": 128, "pad_token_id": PAD, "eos_token_id": EOS}
    if sliding_window:
        return MistralForCausalLM(MistralConfig(sliding_window=sliding_window, **common)).eval()
    return LlamaForCausalLM(LlamaConfig(**common)).eval()


def left_padded(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD)
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(2, 24, (n,), generator=g)
        mask[row, width - n:] = True
    return ids, mask


def batch_sizes_of(model) -> tuple[list[int], object]:
    sizes: list[int] = []
    handle = model.register_forward_pre_hook(lambda m, args, kwargs: sizes.append(kwargs["input_ids"].shape[0]),
                                             with_kwargs=True)
    return sizes, handle


CONFIGS = [SamplingConfig(max_new_tokens=24), SamplingConfig(max_new_tokens=24, temperature=0.7, top_k=5),
           SamplingConfig(max_new_tokens=24, temperature=1.3, top_p=0.8),
           SamplingConfig(max_new_tokens=24, temperature=0.9, top_k=8, top_p=0.9), SamplingConfig.greedy(24)]


@pytest.mark.parametrize("config", CONFIGS, ids=["t1", "t07_k5", "t13_p08", "t09_k8_p09", "greedy"])
@pytest.mark.parametrize("prompts", ["padded", "repeated", "unpadded"])
def test_same_tokens_logps_and_random_state_as_the_previous_loop(config, prompts):
    model = small_vocab_lm()
    if prompts == "padded":
        ids, mask = left_padded([3, 9, 5, 7, 2, 9, 4, 6], seed=1)
    elif prompts == "repeated":  # GRPO's G copies of each prompt: one shared prefill
        ids, mask = left_padded([4, 8], seed=2)
        ids, mask = ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)
    else:
        ids, mask = left_padded([6] * 8, seed=3)
    compacted = False
    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        old_ids, old_logps = previous_sample_tokens(model, ids, mask, config, EOS, PAD, generator=generator,
                                                    return_logps=True)
        old_state = generator.get_state()
        generator = torch.Generator().manual_seed(seed)
        sizes, handle = batch_sizes_of(model)
        new_ids, new_logps = sample_tokens(model, ids, mask, config, EOS, PAD, generator=generator, return_logps=True)
        handle.remove()
        assert torch.equal(new_ids, old_ids), (seed, new_ids, old_ids)
        assert torch.equal(generator.get_state(), old_state)  # the stream continues as after the previous loop
        old_kept = finish_responses(old_ids, config.max_new_tokens, EOS, PAD)
        new_kept = finish_responses(new_ids, config.max_new_tokens, EOS, PAD)
        for old, new in zip(old_kept, new_kept):  # ids, mask, has_eos
            assert torch.equal(new, old)
        kept = old_kept[1][:, :old_logps.shape[1]]
        torch.testing.assert_close(new_logps[kept], old_logps[kept], rtol=0, atol=1e-6)
        compacted |= min(sizes[1:], default=ids.shape[0]) < ids.shape[0]
        assert bool(old_kept[2].any()) or not config.do_sample  # some rows end on EOS within the budget
    if config.do_sample:  # rows finished early and the forward passes left them out
        assert compacted


def test_global_random_stream_and_generate_responses_unchanged():
    model = small_vocab_lm()
    ids, mask = left_padded([5, 2, 8, 3, 6, 6], seed=4)
    config = SamplingConfig(max_new_tokens=16, temperature=0.8, top_p=0.95)
    torch.manual_seed(11)
    old = finish_responses(previous_sample_tokens(model, ids, mask, config, EOS, PAD), 16, EOS, PAD)
    after_old = torch.random.get_rng_state()
    torch.manual_seed(11)
    new = generate_responses(model, ids, mask, config, EOS, PAD)
    assert all(torch.equal(a, b) for a, b in zip(new, old))
    assert torch.equal(torch.random.get_rng_state(), after_old)


def test_sliding_window_model_keeps_its_own_cache_and_the_same_tokens():
    model = small_vocab_lm(sliding_window=4)  # prompts and responses longer than the window
    ids, mask = left_padded([7, 3, 9, 5], seed=5)
    config = SamplingConfig(max_new_tokens=12, temperature=1.1)
    for seed in range(2):
        old = previous_sample_tokens(model, ids, mask, config, EOS, PAD, generator=torch.Generator().manual_seed(seed))
        new = sample_tokens(model, ids, mask, config, EOS, PAD, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(new, old)


def test_the_sampler_benchmark_times_three_samplers_and_renders(tmp_path):
    from benchmarks import bench_generation

    result = bench_generation.main(["--samplers", "--model", "tiny-random-llama", "--rounds", "1", "--warmup", "0",
                                    "--new-tokens", "3", "--grpo-prompts", "1", "--generations", "2",
                                    "--ppo-prompts", "2", "--json", str(tmp_path / "s.json")])
    assert set(result["workloads"]) == {"grpo", "ppo"}
    for workload in result["workloads"].values():
        assert set(workload["seconds"]) == set(bench_generation.SAMPLERS)
        assert all(s["median"] > 0 and s["n"] == 1 for s in workload["seconds"].values())
        assert workload["same_tokens_as_ours"] == {"previous": True, "generate": True}
    page = tmp_path / "RESULTS.md"
    page.write_text("# Results\n\n## Generation backends: hf vs vLLM\n\ntext\n\n## Next\n")
    text = bench_generation.render_samplers(json.loads((tmp_path / "s.json").read_text()))
    assert "| grpo | 2 |" in text and "| ppo | 2 |" in text
    from benchmarks.report import write_block

    write_block(text, bench_generation.BEGIN, bench_generation.END, bench_generation.TITLE, "## Generation backends", page)
    write_block(text, bench_generation.BEGIN, bench_generation.END, bench_generation.TITLE, "## Generation backends", page)
    assert page.read_text().count(bench_generation.BEGIN) == 1 and page.read_text().index("## Next") > page.read_text().index(text)


def test_the_sampler_table_in_results_md_is_its_raw_file_rendered():
    import re
    from pathlib import Path

    from benchmarks import bench_generation

    root = Path(__file__).resolve().parents[1]
    shown = (root / "benchmarks/RESULTS.md").read_text().split(bench_generation.BEGIN, 1)[1]
    shown = shown.split(bench_generation.END, 1)[0].strip("\n")
    raw = re.search(r"Raw file: `([^`]+)`", shown).group(1)
    assert shown == bench_generation.render_samplers(json.loads((root / raw).read_text()))


@pytest.mark.parametrize("prompts", ["padded", "unpadded"])
def test_synced_gpus_a_finished_rank_keeps_forwarding_for_its_peer_and_samples_the_same(monkeypatch, prompts):
    # one process stands in for a rank whose peer needs every token: `_all_ranks_done` reports
    # "done" only once this rank has made the peer's forward passes (the prefill, then R - 1)
    from lit_rlhf.generation import hf

    model, eos = small_vocab_lm(), 3  # a token this model draws often: every row ends early
    ids, mask = left_padded([3, 9, 5, 7] if prompts == "padded" else [6] * 4, seed=6)
    config = SamplingConfig(max_new_tokens=24)
    alone = sample_tokens(model, ids, mask, config, eos, PAD, generator=torch.Generator().manual_seed(0))
    assert alone.shape[1] < config.max_new_tokens - 2
    calls: list[bool] = []
    monkeypatch.setattr(hf, "_all_ranks_done", lambda done, device: calls.append(done) or len(calls) == 24)
    sizes, handle = batch_sizes_of(model)
    synced = sample_tokens(model, ids, mask, config, eos, PAD, synced_gpus=True,
                           generator=torch.Generator().manual_seed(0))
    handle.remove()
    assert torch.equal(synced, alone) and len(sizes) == config.max_new_tokens
    assert calls == [False] * (alone.shape[1] - 1) + [True] * (24 - alone.shape[1] + 1)


@pytest.mark.parametrize("rows", [4, 8])
def test_generate_responses_logps_are_the_loops_on_kept_tokens_and_zero_elsewhere(rows):
    # eos 3, drawn often by this model: 4 rows all end early (the loop returns R' < R columns); of
    # 8, finished rows stay in the forward passes (no compaction yet) and draw tokens after EOS
    model, eos = small_vocab_lm(), 3
    ids, mask = left_padded([3, 9, 5, 7, 4, 8, 6, 2][:rows], seed=6)
    config = SamplingConfig(max_new_tokens=24, temperature=0.8)
    tokens, loop_logps = sample_tokens(model, ids, mask, config, eos, PAD, generator=torch.Generator().manual_seed(0),
                                       return_logps=True)
    _, kept, _, logps = generate_responses(model, ids, mask, config, eos, PAD,
                                           generator=torch.Generator().manual_seed(0), return_logps=True)
    assert logps.shape == kept.shape == (rows, 24) and (tokens.shape[1] < 24) == (rows == 4)
    assert torch.equal(logps[kept], loop_logps[kept[:, :tokens.shape[1]]]) and bool((logps[kept] < 0).all())
    assert bool((logps[~kept] == 0).all()) and bool((loop_logps[~kept[:, :tokens.shape[1]]] != 0).any()) == (rows == 8)
