"""Entry point: `python main.py {fit,validate,test,predict} --config <yaml> [...]` (see lit_rlhf/cli.py);
`python main.py --version` prints the package's version.

`--verbose` (or LIT_RLHF_VERBOSE=1) shows every library warning and progress bar and full
tracebacks; by default the console is quiet (`lit_rlhf.console`).

This is where the two packages meet: `lit_rlhf` (the CLI, with its own default checkpoint on
SIGTERM) never imports the top-level `callbacks` package, and the console's default callbacks
(compact progress bar, dead-run warnings) are handed to it here.
"""

import sys

from lit_rlhf.console import prepare_process  # standard library only: runs before Lightning is imported

if __name__ == "__main__":
    if sys.argv[1:] == ["--version"]:
        from lit_rlhf import __version__

        print(f"lit_rlhf {__version__}")
        sys.exit(0)
    sys.argv[1:] = prepare_process(sys.argv[1:])  # takes out --verbose
    from callbacks import default_callbacks
    from lit_rlhf.cli import run

    run(default_callbacks=default_callbacks)
