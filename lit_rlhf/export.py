"""Export a trained module from a Lightning checkpoint in Hugging Face format.

    python -m lit_rlhf.export path/to/last.ckpt path/to/hf_dir
    python -m lit_rlhf.export path/to/last.ckpt/ path/to/hf_dir    # a DeepSpeed or FSDP2 checkpoint directory

The module is rebuilt from the class, init args and weights the checkpoint records, and its
`export_hf` writes a policy as `AutoModelForCausalLM`, a reward model as
`AutoModelForSequenceClassification`. A DeepSpeed (ZeRO shards) or FSDP2 (distributed-checkpoint
shards and `meta.pt`) checkpoint is first consolidated into one file by pure file operations (one
process, no GPU). Frozen models (reference, reward model) are rebuilt from their names.
"""

from __future__ import annotations

import argparse
import importlib
import tempfile
from pathlib import Path

import torch

from lit_rlhf.training.base import CHECKPOINT_KEY


def module_class_from_checkpoint(checkpoint: dict):
    info = checkpoint.get(CHECKPOINT_KEY)
    if not info or "class_path" not in info:
        raise ValueError(f"the checkpoint has no '{CHECKPOINT_KEY}.class_path': it was not written by a lit_rlhf module")
    module_name, _, class_name = info["class_path"].rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)


def is_deepspeed_checkpoint(path: str | Path) -> bool:
    """True for a DeepSpeed (ZeRO) checkpoint directory as Lightning's DeepSpeedStrategy saves it."""
    path = Path(path)
    return path.is_dir() and ((path / "latest").is_file() or any(path.glob("*/*model_states.pt")))


def consolidate_deepspeed_checkpoint(ckpt_dir: str | Path, output_file: str | Path, tag: str | None = None) -> Path:
    """Merge the ZeRO shards of `ckpt_dir` into one Lightning checkpoint file (fp32 weights)."""
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    output_file = Path(output_file)
    output_file.parent.mkdir(parents=True, exist_ok=True)
    convert_zero_checkpoint_to_fp32_state_dict(str(ckpt_dir), str(output_file), tag=tag)
    return output_file


def is_distributed_checkpoint(path: str | Path) -> bool:
    """True for a sharded checkpoint directory as Lightning's ModelParallelStrategy (FSDP2) saves
    it: torch distributed-checkpoint files (`.metadata`) and Lightning's `meta.pt`."""
    path = Path(path)
    return path.is_dir() and (path / ".metadata").is_file() and (path / "meta.pt").is_file()


def consolidate_distributed_checkpoint(ckpt_dir: str | Path, output_file: str | Path) -> Path:
    """Merge the FSDP2 shards of `ckpt_dir` into one Lightning checkpoint file: `meta.pt` with the
    full `state_dict` (the optimizer states are left out: an export does not need them)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt_dir, output_file = Path(ckpt_dir), Path(output_file)
    output_file.parent.mkdir(parents=True, exist_ok=True)
    dcp_to_torch_save(ckpt_dir, output_file)
    state = torch.load(output_file, map_location="cpu", weights_only=False)
    checkpoint = torch.load(ckpt_dir / "meta.pt", map_location="cpu", weights_only=False)
    checkpoint["state_dict"] = state["state_dict"]
    torch.save(checkpoint, output_file)
    return output_file


def load_module(ckpt_path: str | Path, map_location: str = "cpu"):
    """Rebuild the LightningModule saved in `ckpt_path`: a `.ckpt` file, a DeepSpeed or an FSDP2
    (distributed checkpoint) directory."""
    ckpt_path = Path(ckpt_path)
    for is_sharded, consolidate in ((is_deepspeed_checkpoint, consolidate_deepspeed_checkpoint),
                                    (is_distributed_checkpoint, consolidate_distributed_checkpoint)):
        if is_sharded(ckpt_path):
            with tempfile.TemporaryDirectory() as tmp:
                return load_module(consolidate(ckpt_path, Path(tmp) / "consolidated.ckpt"), map_location)
    if ckpt_path.is_dir():
        raise FileNotFoundError(
            f"{ckpt_path} is a directory but not a DeepSpeed checkpoint (no 'latest' file, no '*/*model_states.pt') "
            "nor a distributed (FSDP2) one (no '.metadata' and 'meta.pt')"
        )
    if not ckpt_path.is_file():
        raise FileNotFoundError(f"checkpoint {ckpt_path} does not exist or is not a file")
    checkpoint = torch.load(ckpt_path, map_location=map_location, weights_only=False)
    cls = module_class_from_checkpoint(checkpoint)
    # a full unpickle, as just above: a consolidated DeepSpeed checkpoint carries numpy RNG states
    return cls.load_from_checkpoint(ckpt_path, map_location=map_location, weights_only=False)


def export_checkpoint(ckpt_path: str | Path, out_dir: str | Path) -> Path:
    return load_module(ckpt_path).export_hf(out_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a Lightning .ckpt file, or a DeepSpeed or FSDP2 checkpoint directory, written by a lit_rlhf module")
    parser.add_argument("out_dir", help="directory to write the Hugging Face model and tokenizer to")
    args = parser.parse_args(argv)
    print(f"exported to {export_checkpoint(args.checkpoint, args.out_dir)}")


if __name__ == "__main__":
    main()
