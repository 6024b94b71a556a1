"""`python -m autofusion_worker --targets cpu` — the same as `autofusion worker`."""

from __future__ import annotations

import argparse
import sys

from .cli import add_commands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="autofusion")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["worker", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
