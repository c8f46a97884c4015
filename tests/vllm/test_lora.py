"""LoRA policies on the vLLM backend: the engine holds the base with the policy adapter merged
(never the value or reward adapter), computed out of place; syncs after the first send only the
layers the adapter changes (fused q/k/v and gate/up layers whole); greedy tokens and log-probs
follow the trainer's; GRPO with lora + vllm trains; `judge_policy --generation_backend vllm`
judges a LoRA checkpoint as the hf sampler does."""

from __future__ import annotations

import gc
import json
import math

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_rlhf.generation import SamplingConfig, generate_responses, sequence_token_logps
from lit_rlhf.generation.vllm_process import live_in_process_engines
from lit_rlhf.generation.vllm_weights import save_merged_checkpoint, with_packed_siblings
from lit_rlhf.judges import Judgement, PairwiseJudge
from lit_rlhf.models import adapters, load_causal_lm, load_tokenizer, scalar_adapters
from lit_rlhf.modules import PPOModule
from lit_rlhf.online import VLLMSampler
from lit_rlhf.rewards import CharacterFractionReward
from tests.lora.test_adapters import perturb
from tests.vllm.conftest import attach
from tests.vllm.test_engine import LOGP_ATOL
from tests.vllm.test_fit import fit, grpo

LORA = {"r": 4, "alpha": 8}
GREEDY = SamplingConfig(max_new_tokens=12, temperature=1.0, do_sample=False)
LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LongerWins(PairwiseJudge):
    """The longer completion wins (a judge without a model)."""

    def judge(self, prompts, completions_a, completions_b):
        return [Judgement("a" if len(a) > len(b) else "b" if len(b) > len(a) else "tie")
                for a, b in zip(completions_a, completions_b)]


@pytest.fixture(scope="module")
def prompts(vllm_model_dir):
    tokenizer = load_tokenizer(vllm_model_dir, padding_side="left")
    batch = tokenizer(["hello world", "a b c d e f", "x", "The cat sat"], return_tensors="pt", padding=True)
    return tokenizer, batch.input_ids, batch.attention_mask.bool()


def lora_policy(model_dir, tokenizer, lora=LORA):
    policy = adapters.add_lora(load_causal_lm(model_dir, tokenizer, dtype="float32"), adapters.lora_config(lora))
    adapters.set_trainable(policy, {adapters.POLICY: True})
    return policy


def train(policy, ids, mask, steps=3, seed=0):
    """A few Adam steps of the policy adapter towards random tokens (LoRA B starts at zero)."""
    gen = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, policy.config.vocab_size, ids.shape, generator=gen)
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=0.05)
    for _ in range(steps):
        logits = policy(input_ids=ids, attention_mask=mask.long()).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_unchanged(model, before):
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert not [k for k in before if not torch.equal(before[k], after[k])]


def recording(engine):
    """Make `engine.load_weights` record the names of each load; returns the list of loads."""
    loads = []
    load = engine.load_weights

    def spy(weights, partial=False):
        weights = list(weights)
        loads.append(({n for n, _ in weights}, partial))
        return load(weights, partial)

    engine.load_weights = spy
    return loads


def engine_vs_trainer(engine, model, tokenizer, ids, mask):
    """The engine's greedy tokens equal `model`'s (hf), and its log-probs the trainer's; returns them."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    v_ids, v_mask, v_eos, v_logps = engine.generate(ids, mask, GREEDY, eos, pad)
    with torch.no_grad():
        h_ids, h_mask, h_eos = generate_responses(model, ids, mask, GREEDY, eos, pad)
        trainer_logps = sequence_token_logps(model, ids, mask, h_ids, h_mask, 1.0)
    assert torch.equal(v_ids, h_ids) and torch.equal(v_mask, h_mask) and torch.equal(v_eos, h_eos)
    assert torch.allclose(v_logps, trainer_logps, atol=LOGP_ATOL, rtol=0)
    return v_ids, v_logps


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]], ids=["all-linear", "q-v"])
def test_lora_policy_greedy_and_logps_follow_the_trainer_across_syncs(targets, vllm_model_dir, engine, prompts):
    tokenizer, ids, mask = prompts
    policy = lora_policy(vllm_model_dir, tokenizer, {**LORA, "target_modules": targets})
    loads = recording(engine)
    try:
        train(policy, ids, mask)
        before = snapshot(policy)
        engine.sync_weights(policy, step=1)  # the engine held another model: everything, merged
        assert_unchanged(policy, before)  # merged out of place: the trained model is untouched
        first = engine_vs_trainer(engine, policy.eval(), tokenizer, ids, mask)
        train(policy.train(), ids, mask, seed=1)
        before = snapshot(policy)
        engine.sync_weights(policy, step=2)  # the same frozen base: only the adapter's layers
        assert_unchanged(policy, before)
        second = engine_vs_trainer(engine, policy.eval(), tokenizer, ids, mask)
    finally:
        del engine.load_weights  # back to the class method
    assert not (torch.equal(first[0], second[0]) and torch.allclose(first[1], second[1]))  # the sync mattered
    (full, full_partial), (sent, partial) = loads
    assert not full_partial and partial
    assert "model.embed_tokens.weight" in full and "model.norm.weight" in full
    # fused layers are sent whole: q and v adapted means q, k and v (vLLM's qkv_proj) are sent
    parts = LINEAR if targets == "all-linear" else ["q_proj", "k_proj", "v_proj"]
    expected = {n for n in full if n.rsplit(".", 2)[-2] in parts}
    assert sent == expected, sorted(sent ^ expected)


def test_ppo_engine_holds_base_and_policy_adapter_only(vllm_model_dir, engine, prompts, tmp_path):
    """PPO with LoRA: policy, value and reward are adapters on one base; the engine gets the base
    with the policy adapter merged (as `merged_copy`), and a sync leaves the model bitwise as it was."""
    from transformers import AutoModelForCausalLM

    tokenizer, ids, mask = prompts
    module = PPOModule(model=vllm_model_dir, reward_fns=[CharacterFractionReward()], max_new_tokens=4, lora=LORA,
                       rollout=VLLMSampler())
    scalar_adapters.scalar_adapter(module.policy, adapters.REWARD, module.lora_config, trainable=False)
    model = module.policy
    assert adapters.adapter_names(model) == ["policy", "value", "reward"]
    for seed, name in enumerate(adapters.adapter_names(model)):
        perturb(model, name, seed=seed)
    model.eval()
    attach(module, engine)
    for sync in range(2):
        if sync:
            perturb(model, adapters.POLICY, seed=7)  # an update of the policy adapter only
        before = snapshot(model)
        engine.sync_weights(model, step=sync, adapter=adapters.POLICY)
        assert_unchanged(model, before)
        merged = adapters.merged_copy(model, adapters.POLICY).eval()
        v_ids, v_logps = engine_vs_trainer(engine, merged, tokenizer, ids, mask)
        with torch.no_grad():  # the trainer's policy (the adapter active on the shared base) agrees
            h_ids, _, _ = generate_responses(model, ids, mask, GREEDY, tokenizer.eos_token_id, tokenizer.pad_token_id)
            with_value = adapters.merged_copy(model, adapters.VALUE).eval()
            value_logps = sequence_token_logps(with_value, ids, mask, v_ids, v_ids != tokenizer.pad_token_id, 1.0)
        assert torch.equal(h_ids, v_ids)
        assert (value_logps - v_logps).abs().max() > 1e-2  # another adapter's weights would show
    # the module's own path: its source's `synced_engine` gives the engine the policy adapter on every new step
    assert module.rollout_source.synced_engine(module.sampled_model()) is engine and engine.synced_step == 0
    # the merged checkpoint an engine is built from is the same network, bitwise
    save_merged_checkpoint(model, adapters.POLICY, tmp_path)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    expected = adapters.merged_copy(model, adapters.POLICY).state_dict()
    got = saved.state_dict()
    assert {k for k in expected if "rotary" not in k} == {k for k in got if "rotary" not in k}
    assert all(torch.equal(got[k], v) for k, v in expected.items() if "rotary" not in k)


def test_packed_siblings_complete_fused_layers():
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    got = with_packed_siblings({"model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj",
                                "model.layers.1.mlp.up_proj"}, packed)
    assert got == {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                   "model.layers.0.self_attn.v_proj", "model.layers.1.mlp.down_proj",
                   "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"}
    assert with_packed_siblings(set(), packed) == set()


def test_engine_refuses_an_adapter_the_policy_lacks(vllm_model_dir, engine, prompts):
    tokenizer, _, _ = prompts
    plain = load_causal_lm(vllm_model_dir, tokenizer, dtype="float32")
    with pytest.raises(ValueError, match="has no LoRA adapters"):
        engine.sync_weights(plain, adapter=adapters.POLICY)
    with pytest.raises(ValueError, match="no adapter 'value'"):
        engine.sync_weights(lora_policy(vllm_model_dir, tokenizer), adapter=adapters.VALUE)
    # tied embeddings: LoRA on the lookup (or a trained copy of the output layer) cannot be served
    for lora in ({**LORA, "target_modules": ["q_proj", "embed_tokens"]}, {**LORA, "modules_to_save": ["lm_head"]}):
        with pytest.raises(ValueError, match="tied embeddings"):
            engine.sync_weights(lora_policy(vllm_model_dir, tokenizer, lora))


@pytest.fixture(scope="module")
def lora_grpo_fit(vllm_model_dir, engine, tmp_path_factory):
    """GRPO with lora on the vllm backend: 3 rollouts (6 optimizer steps), last.ckpt saved."""
    root = tmp_path_factory.mktemp("lora-grpo")
    module = attach(grpo(vllm_model_dir, "vllm", lora=LORA, total_episodes=16 * 3), engine)
    checkpoint = ModelCheckpoint(dirpath=root / "checkpoints", save_last=True, save_top_k=0, every_n_train_steps=1)
    _, metrics = fit(module, root, callbacks=[checkpoint])
    return module, metrics, root / "checkpoints" / "last.ckpt"


def test_grpo_with_lora_on_vllm_samples_the_trained_adapter(lora_grpo_fit, vllm_model_dir):
    module, metrics, _ = lora_grpo_fit
    assert len(metrics) == 3 and module.global_step == 6
    diffs = [m["train/rollout/sampler_logprob_diff_max"] for m in metrics]
    assert all(math.isfinite(d) and d < 1e-3 for d in diffs), diffs  # the engine follows the adapter
    # the adapter trained; the base (the reference) did not move
    assert any(p.abs().max() > 0 for n, p in adapters.adapter_parameters(module.policy, adapters.POLICY)
               if "lora_B" in n)
    base = load_causal_lm(vllm_model_dir, module.tokenizer, dtype="float32").state_dict()
    for name, tensor in module.policy.get_base_model().state_dict().items():
        if "lora_" not in name:
            assert torch.equal(tensor, base[name.replace(".base_layer.", ".")]), name


def test_judge_policy_cli_samples_a_lora_checkpoint_with_vllm(lora_grpo_fit, vllm_model_dir, engine, prompts,
                                                              tmp_path):
    """`judge_policy --generation_backend vllm` on a LoRA .ckpt (an engine built from the merged
    policy) judges the same greedy completions as the hf sampler, baseline model included; its
    engine, once collected, leaves the session's engine (same process) able to sample."""
    from lit_rlhf.apps.judge_policy import main

    _, _, trained = lora_grpo_fit
    # a few steps of the tiny model leave its greedy text as the base's: move the adapter further
    checkpoint = torch.load(trained, weights_only=False)
    gen = torch.Generator().manual_seed(0)
    for name, tensor in checkpoint["state_dict"].items():
        if "lora_B.policy" in name:
            tensor.add_(0.5 * torch.randn(tensor.shape, generator=gen))
    torch.save(checkpoint, ckpt := tmp_path / "moved.ckpt")

    def run(backend, *extra):
        out = tmp_path / backend
        metrics = main(["--policy", str(ckpt), "--baseline", vllm_model_dir, "--prompts", "bundled:arithmetic",
                        "--data_class", "lit_rlhf.data.QADataModule", "--split", "validation",
                        "--judge", "tests.vllm.test_lora.LongerWins", "--num_prompts", "5", "--max_new_tokens", "8",
                        "--batch_size", "2", "--output_dir", str(out), "--generation_backend", backend, *extra])
        rows = [json.loads(line) for line in (out / "judgements.jsonl").read_text().splitlines()]
        return metrics, rows

    engines = live_in_process_engines()  # the session's
    on_vllm, vllm_rows = run("vllm", "--vllm_kwargs", '{"max_model_len": 256}')
    on_hf, hf_rows = run("hf")
    assert len(vllm_rows) == 5 and any(r["policy"] for r in vllm_rows)
    assert [r["policy"] for r in vllm_rows] == [r["policy"] for r in hf_rows]
    assert [r["baseline"] for r in vllm_rows] == [r["baseline"] for r in hf_rows]
    assert [r["policy"] for r in vllm_rows] != [r["baseline"] for r in vllm_rows]  # the adapter is in
    assert on_vllm == on_hf
    gc.collect()  # judge_policy's engines shut down: the distributed state they shared stays for the session's
    assert live_in_process_engines() == engines
    tokenizer, ids, mask = prompts
    assert engine.generate(ids, mask, GREEDY, tokenizer.eos_token_id, tokenizer.pad_token_id)[1].any()
    with pytest.raises(ValueError, match="--vllm_kwargs must be a JSON object"):
        main(["--policy", str(ckpt), "--prompts", "bundled:arithmetic", "--judge", "x", "--generation_backend",
              "vllm", "--vllm_kwargs", "[1]"])
    with pytest.raises(ValueError, match="needs --generation_backend vllm"):
        main(["--policy", str(ckpt), "--prompts", "bundled:arithmetic", "--judge", "x",
              "--vllm_kwargs", '{"max_model_len": 256}'])
