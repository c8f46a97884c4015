"""Generation: the sampling settings and post-processing every backend shares (`config`), our
KV-cache sampler (`hf`, the reference backend), a colocated vLLM engine (`vllm`, an optional
dependency, imported on use; the weights it gets from the policy: `vllm_weights`), and the
log-probs of sampled responses (`lit_rlhf.models.logprobs`).
"""

from lit_rlhf.generation.config import (
    SamplingConfig, check_prompts, decode_responses, finish_responses, needs_synced_gpus
)
from lit_rlhf.generation.hf import filter_logits, generate_responses, sample_tokens
from lit_rlhf.models.logprobs import sequence_token_logps, token_logps_with_grad

__all__ = [
    "SamplingConfig", "check_prompts", "decode_responses", "filter_logits", "finish_responses", "generate_responses",
    "needs_synced_gpus", "sample_tokens", "sequence_token_logps", "token_logps_with_grad"
]
