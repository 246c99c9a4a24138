"""Command line: ``python -m tenferro demo [--device N]``."""

from __future__ import annotations

import argparse
import sys

from .errors import RuntimeStateError


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the command; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tenferro")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compile and launch real kernels on a GPU and check them")
    demo.add_argument("--device", type=int, default=0)
    ns = parser.parse_args(argv)
    if ns.command == "demo":
        from .demo import run_demo

        try:
            return run_demo(ns.device)
        except RuntimeStateError as exc:
            print(f"tenferro demo: {exc}", file=sys.stderr)
            return 2
    return 2  # pragma: no cover - argparse refuses other commands


if __name__ == "__main__":
    sys.exit(main())
