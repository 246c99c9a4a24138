"""`Foreign`: what a producer said about its array, read through DLPack or its CAI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..dtypes import ScalarType

__all__ = ["Foreign"]


@dataclass(slots=True)
class Foreign:
    """What a producer told us about its array."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    scalar_type: ScalarType
    readonly: bool
    stream: int | None  # the producer's stream handle to order after; None: nothing to wait for
    owner: Any
    device: int | None = None  # the producer's own claim (DLPack); CAI does not say
