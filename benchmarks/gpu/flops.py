"""Model FLOPs of the GPU benchmark's workloads, and model FLOPs utilisation (MFU).

Counting (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Table 1; Chowdhery et
al. 2022, "PaLM", Appendix B):

- a forward pass costs `2 N` FLOPs per token, `N` the weights used in matrix multiplications
  (every linear layer of the decoder and the output layer; the input embedding is a lookup and
  is not counted, a tied output layer is counted once as the matmul it is), plus attention's
  `4 L d_attn S` per token (scores and weighted values over `S` positions; counted over all `S`
  as PaLM does, not halved for the causal mask);
- a trained token costs three forwards: `6 N + 12 L d_attn S`;
- a generated token (KV cache) costs `2 N + 4 L d_attn c`, `c` the positions it attends to; the
  prompt's prefill is a forward over the prompt.

MFU = the model FLOPs a step needs / (step seconds x the GPU's peak dense bf16 FLOP/s). The model
FLOPs are what the workload needs, the same for every framework (a recomputed activation, an
extra log-prob pass or padding costs time, not model FLOPs), so a faster framework has the
higher MFU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelShape:
    """A Llama-architecture decoder (the shape `transformers.LlamaConfig` builds)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = True
    rope_theta: float = 100000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def attn_dim(self) -> int:
        """Query width: heads x head dim."""
        return self.heads * self.head_dim

    def layer_matmul_params(self) -> int:
        """Weights of one decoder layer's matmuls: q, k, v, o and the gated MLP (gate, up, down)."""
        kv = self.kv_heads * self.head_dim
        attention = self.hidden * self.attn_dim + 2 * self.hidden * kv + self.attn_dim * self.hidden
        return attention + 3 * self.hidden * self.intermediate

    def matmul_params(self, head: str = "lm") -> int:
        """`N`: the decoder's matmul weights plus the output layer (`lm`: vocab logits; `scalar`:
        one score, a reward or value model)."""
        out = self.hidden * self.vocab if head == "lm" else self.hidden
        return self.layers * self.layer_matmul_params() + out

    def parameters(self) -> int:
        """All weights, embeddings and norms included (the model's parameter count)."""
        norms = (2 * self.layers + 1) * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.layer_matmul_params() + norms + embeddings

    def llama_config(self) -> dict:
        """Keyword arguments of `transformers.LlamaConfig` for this shape."""
        return dict(
            vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.intermediate,
            num_hidden_layers=self.layers, num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim, max_position_embeddings=8192, rope_theta=self.rope_theta, rms_norm_eps=1e-5,
            tie_word_embeddings=self.tied, hidden_act="silu", attention_bias=False, mlp_bias=False,
        )

    @classmethod
    def from_config(cls, config) -> "ModelShape":
        """The shape of a built model from its transformers config (the inverse of `llama_config`)."""
        return cls(layers=config.num_hidden_layers, hidden=config.hidden_size, heads=config.num_attention_heads,
                   kv_heads=config.num_key_value_heads, intermediate=config.intermediate_size, vocab=config.vocab_size,
                   tied=bool(config.tie_word_embeddings), rope_theta=float(getattr(config, "rope_theta", 100000.0)))

    def to_dict(self) -> dict:
        return asdict(self)


# Published shapes of the SmolLM2 family (HuggingFaceTB/SmolLM2-360M and -1.7B configs): the
# embedded SmolLM2-135M-Instruct's tokenizer fits all of them, so every size is built with it.
SHAPES: dict[str, ModelShape] = {
    "smollm2-360m": ModelShape(layers=32, hidden=960, heads=15, kv_heads=5, intermediate=2560, vocab=49152),
    "smollm2-1.7b": ModelShape(layers=24, hidden=2048, heads=32, kv_heads=32, intermediate=8192, vocab=49152,
                               rope_theta=130000.0),
    # the dry run's shape (CPU, seconds); its vocab follows the tiny tokenizer
    "tiny": ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=0),
}


def forward_flops(shape: ModelShape, rows: int, length: int, head: str = "lm") -> float:
    """A forward pass over `rows` sequences of `length` tokens."""
    per_token = 2 * shape.matmul_params(head) + 4 * shape.layers * shape.attn_dim * length
    return float(rows * length * per_token)


def train_flops(shape: ModelShape, rows: int, length: int, head: str = "lm") -> float:
    """Forward and backward over `rows` sequences of `length` tokens (3 forwards)."""
    return 3.0 * forward_flops(shape, rows, length, head)


def generation_flops(shape: ModelShape, rows: int, prompt: int, new: float) -> float:
    """Prefill `prompt` tokens, then `new` tokens one at a time with a KV cache (the t-th new
    token attends to `prompt + t` positions); `new` may be a mean length (a float)."""
    prefill = forward_flops(shape, rows, prompt)
    attended = new * prompt + new * (new + 1) / 2  # sum over t = 1..new of (prompt + t)
    decode = rows * (2 * shape.matmul_params() * new + 4 * shape.layers * shape.attn_dim * attended)
    return prefill + float(decode)


def step_flops(method: str, shape: ModelShape, *, batch: int, prompt: int, completion: float,
               generations: int = 1, ppo_epochs: int = 1) -> dict[str, float]:
    """Model FLOPs of one step of a benchmark workload, by phase (`generation`, `scoring`: the
    forward-only passes, `update`: the trained passes) and `total`.

    - `sft`: `batch` rows of `prompt + completion` tokens trained;
    - `dpo`: `batch` pairs: 2 x batch rows trained, and the reference's forward over them;
    - `grpo`: `batch` prompts x `generations` samples of `completion` new tokens (a mean length),
      the reference's forward and one trained pass over them (one optimizer step per rollout:
      the sampling policy's log-probs are the trained pass's own, detached);
    - `ppo`: `batch` prompts, one sample each; the reference's, the value model's and the reward
      model's forwards, then `ppo_epochs` trained passes of policy and value model (the value and
      reward models are the policy's shape with a scalar head, Detail 22).
    """
    length = prompt + completion
    out = {"generation": 0.0, "scoring": 0.0, "update": 0.0}
    if method == "sft":
        out["update"] = train_flops(shape, batch, length)
    elif method == "dpo":
        out["scoring"] = forward_flops(shape, 2 * batch, length)
        out["update"] = train_flops(shape, 2 * batch, length)
    elif method == "grpo":
        rows = batch * generations
        out["generation"] = generation_flops(shape, rows, prompt, completion)
        out["scoring"] = forward_flops(shape, rows, length)
        out["update"] = train_flops(shape, rows, length)
    elif method == "ppo":
        out["generation"] = generation_flops(shape, batch, prompt, completion)
        out["scoring"] = forward_flops(shape, batch, length) + 2 * forward_flops(shape, batch, length, head="scalar")
        out["update"] = ppo_epochs * (train_flops(shape, batch, length) + train_flops(shape, batch, length, head="scalar"))
    else:
        raise ValueError(f"unknown method {method!r}; expected sft, dpo, grpo or ppo")
    out["total"] = out["generation"] + out["scoring"] + out["update"]
    return out


# Peak dense bf16 tensor-core FLOP/s from NVIDIA's datasheets (without 2:4 sparsity), by a
# substring of `torch.cuda.get_device_name()`; first match wins, so the specific names come first.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989.4e12),  # SXM (`NVIDIA H100 80GB HBM3`)
    ("H200", 989.4e12),
    ("GH200", 989.4e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
)


def peak_bf16_flops(device_name: str) -> float | None:
    """The datasheet's peak dense bf16 FLOP/s of a GPU by name, or None when unknown."""
    for key, flops in PEAK_BF16_FLOPS:
        if key in device_name:
            return flops
    return None


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: `flops` done in `seconds` over `peak` FLOP/s."""
    if peak is None or seconds <= 0:
        return None
    return flops / seconds / peak
