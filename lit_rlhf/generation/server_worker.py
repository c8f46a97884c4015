"""Code that runs inside the vLLM server's worker process: loading a weight version from a file.

vLLM mixes this class into its worker (`--worker-extension-cls
lit_rlhf.generation.server_worker.WeightReceiver`, set by `lit_rlhf.generation.server`), and the
server's `/collective_rpc` route calls its methods by name (the server runs with
`VLLM_SERVER_DEV_MODE=1`, which opens that route). `lit_rlhf_load_weights` reads one
safetensors file written by `lit_rlhf.generation.weight_sync.FileWeightSync`, refuses it unless
its version stamp is the one asked for, and loads it in place with the same steps as the
colocated engine (`lit_rlhf.generation.vllm.VLLMEngine.load_weights`): vLLM's in-place reload of
checkpoint-format tensors, then the embedding layers' post-processing redone (a tied output
layer gets no tensor of its own, so the reload would leave its CPU GEMM copy stale).
"""

from __future__ import annotations


class WeightReceiver:
    """Methods vLLM adds to its worker (called through `/collective_rpc`)."""

    def lit_rlhf_load_weights(self, path: str, version: str) -> str:
        """Load the weights of `path` (a safetensors file stamped `version`); returns the version."""
        from safetensors import safe_open

        from lit_rlhf.generation.vllm_weights import reprocess_embeddings
        from lit_rlhf.generation.weight_sync import VERSION_KEY

        with safe_open(path, framework="pt") as f:
            stamped = (f.metadata() or {}).get(VERSION_KEY)
            if stamped != str(version):
                raise ValueError(f"{path} is stamped version {stamped}, the trainer asked to load version {version}")
            weights = [(name, f.get_tensor(name)) for name in f.keys()]
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        reprocess_embeddings(self.model_runner.get_model())
        return str(version)