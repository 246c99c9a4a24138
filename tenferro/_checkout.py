"""`tenferro.kernels` from a checkout: the repository's top-level ``kernels/`` and nothing else.

An installed tenferro has ``tenferro/kernels`` (pyproject's ``package-dir`` puts it there).
Imported from a checkout on ``sys.path``, the package finds the top-level ``kernels/`` through
`KernelsFinder`, which answers for ``tenferro.kernels`` alone: the repository's other folders
(benchmarks, tests, notebooks) never import as ``tenferro.*``, and a tool that walks the
package does not walk the repository.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["KernelsFinder", "find_checkout_kernels"]

NAME = "tenferro.kernels"


class KernelsFinder(importlib.abc.MetaPathFinder):
    """Finds ``tenferro.kernels`` in ``directory`` (its submodules follow from its path)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """The spec of ``tenferro.kernels``; None for every other name."""
        if fullname != NAME:
            return None
        return importlib.util.spec_from_file_location(
            NAME,
            os.path.join(self.directory, "__init__.py"),
            submodule_search_locations=[self.directory],
        )


def find_checkout_kernels(package_dir: str) -> None:
    """Let ``tenferro.kernels`` import from a checkout's ``kernels/`` beside ``package_dir``.

    Nothing happens where the package has its own ``kernels`` (installed), where there is no
    such folder, or where a finder for it is already in place. The finder goes first, ahead
    of an editable install's finder for another tree.
    """
    if os.path.isfile(os.path.join(package_dir, "kernels", "__init__.py")):
        return
    directory = os.path.join(os.path.dirname(package_dir), "kernels")
    if not os.path.isfile(os.path.join(directory, "__init__.py")):
        return
    if any(isinstance(f, KernelsFinder) for f in sys.meta_path):
        return
    # First: an editable install of another tree maps tenferro.kernels to that tree's folder,
    # and the kernels must be those beside the tenferro that was imported.
    sys.meta_path.insert(0, KernelsFinder(directory))
