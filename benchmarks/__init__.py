"""CPU speed benchmarks of the lit_rlhf modules, side by side with TRL (see benchmarks/README.md)."""
