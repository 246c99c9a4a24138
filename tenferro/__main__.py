"""Command line: ``python -m tenferro demo [--device N]``, ``info`` and ``--version``."""

from __future__ import annotations

import argparse
import sys

from ._version import __version__
from .errors import TenferroError


def _device_ordinal(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; device ordinals start at 0")
    return value


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the command; return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tenferro")
    parser.add_argument("--version", action="version", version=f"tenferro {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compile and launch real kernels on a GPU and check them")
    demo.add_argument(
        "--device", type=_device_ordinal, default=0, help="the device ordinal (default 0)"
    )
    sub.add_parser(
        "info", help="versions, the driver, devices and the compile cache; works without a GPU"
    )
    ns = parser.parse_args(argv)
    if ns.command == "info":
        from .info import report

        print(report())
        return 0
    if ns.command == "demo":
        from .demo import run_demo

        try:
            return run_demo(ns.device)
        except TenferroError as exc:
            print(f"tenferro demo: {exc}", file=sys.stderr)
            return 2
    return 2  # pragma: no cover - argparse refuses other commands


if __name__ == "__main__":
    sys.exit(main())
