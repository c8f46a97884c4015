"""RLHF and preference alignment of language models as PyTorch Lightning modules."""

__version__ = "0.1.0"  # docs/changelog.md; `python main.py --version`
