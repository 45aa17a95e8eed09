"""``python -m autograd_run ARGS``: the ``autograd-run`` command (where its script is not on PATH)."""

from autograd_run.cli.main import main

if __name__ == "__main__":
    main()
