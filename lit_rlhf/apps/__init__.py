"""The command-line tools: `python -m lit_rlhf.apps.<tool>` (compare policies, judge a policy, judge agreement)."""
