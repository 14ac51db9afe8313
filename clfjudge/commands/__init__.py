"""Sub-commands of the `clfjudge` CLI, one module each (see clfjudge/cli.py)."""
