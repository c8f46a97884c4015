"""Entry point: `python main.py {fit,validate,test,predict} --config <yaml> [...]` (see lit_rlhf/cli.py)."""

from lit_rlhf.cli import main

if __name__ == "__main__":
    main()
