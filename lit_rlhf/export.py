"""Export a trained module from a Lightning checkpoint in Hugging Face format.

    python -m lit_rlhf.export path/to/last.ckpt path/to/hf_dir

The module class is read from the checkpoint (every lit_rlhf module records it), the module is
rebuilt from its saved init args and weights, and its `export_hf` writes what plain
`transformers` loads: a policy as `AutoModelForCausalLM`, a reward model as
`AutoModelForSequenceClassification`.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import torch

from lit_rlhf.modules.base import CHECKPOINT_KEY


def module_class_from_checkpoint(checkpoint: dict):
    info = checkpoint.get(CHECKPOINT_KEY)
    if not info or "class_path" not in info:
        raise ValueError(f"the checkpoint has no '{CHECKPOINT_KEY}.class_path': it was not written by a lit_rlhf module")
    module_name, _, class_name = info["class_path"].rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)


def load_module(ckpt_path: str | Path, map_location: str = "cpu"):
    """Rebuild the LightningModule saved in `ckpt_path` (a file; DeepSpeed directories: see issue 8)."""
    ckpt_path = Path(ckpt_path)
    if not ckpt_path.is_file():
        raise FileNotFoundError(f"checkpoint {ckpt_path} does not exist or is not a file")
    checkpoint = torch.load(ckpt_path, map_location=map_location, weights_only=False)
    cls = module_class_from_checkpoint(checkpoint)
    return cls.load_from_checkpoint(ckpt_path, map_location=map_location)


def export_checkpoint(ckpt_path: str | Path, out_dir: str | Path) -> Path:
    module = load_module(ckpt_path)
    return module.export_hf(out_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a Lightning .ckpt written by a lit_rlhf module")
    parser.add_argument("out_dir", help="directory to write the Hugging Face model and tokenizer to")
    args = parser.parse_args(argv)
    out = export_checkpoint(args.checkpoint, args.out_dir)
    print(f"exported to {out}")


if __name__ == "__main__":
    main()
