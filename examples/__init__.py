"""Worked examples of extending lit_rlhf (see README, "Write a new method")."""
