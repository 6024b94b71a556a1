"""`python -m autofusion_service serve …` — the same as `autofusion serve`.

Workers have their own entry point (`python -m autofusion_worker`); the service never imports them."""

from __future__ import annotations

import argparse
import sys

from .cli import add_commands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="autofusion")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
