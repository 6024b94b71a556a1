"""`python -m autofusion_service serve …` and `python -m autofusion_service worker …`.

The same subcommands as the `autofusion` command line, for when only these packages are at hand."""

from __future__ import annotations

import argparse
import sys

from autofusion_worker.cli import add_commands as add_worker_commands

from .cli import add_commands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="autofusion")
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_commands(subparsers)
    add_worker_commands(subparsers)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
