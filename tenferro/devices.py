"""Which devices a process sees, and which one is this process's under a launcher.

Device ordinals are the driver's, so they follow ``CUDA_VISIBLE_DEVICES``: with
``CUDA_VISIBLE_DEVICES=2,3`` device 0 is the machine's third GPU. Under ``torchrun`` (or any
launcher that sets ``LOCAL_RANK``) each process opens ``tf.Session(device=tf.local_device())``.
"""

from __future__ import annotations

import os

from . import _driver
from .errors import RuntimeStateError, ValidationError

__all__ = ["device_count", "is_available", "local_device"]


def device_count() -> int:
    """How many devices the driver sees in this process (after ``CUDA_VISIBLE_DEVICES``).

    Returns:
        The device count; device ordinals run from 0 to one less.

    Raises:
        RuntimeStateError: No CUDA driver (or its Python bindings), or the driver failed to
            initialise or found no GPU.
        BackendError: The driver refused the count.
    """
    _driver.ensure_init("tenferro.device_count")
    return _driver.device_count()


def is_available() -> bool:
    """True where the CUDA driver loads and sees at least one device; never raises.

    The probe to ask before opening a `Session` (which raises `RuntimeStateError` with the
    reason where this is False; ``python -m tenferro info`` prints what was found).

    Returns:
        True where the driver initialised and sees a device; False on any failure (no
            CUDA Python bindings, no driver, a driver that fails to initialise, no device).
    """
    try:
        _driver.ensure_init("tenferro.is_available")
        return _driver.device_count() > 0
    except Exception:  # no driver, a driver too old, no device: not available, for any reason
        return False


def local_device(env: str = "LOCAL_RANK", default: int = 0) -> int:
    """The device for this process: the integer in environment variable ``env``, else ``default``.

    Refused: a value that is not an integer >= 0 (ValidationError), and one past the devices
    this process sees (RuntimeStateError, naming both; one process a GPU wants as many GPUs
    visible as there are local ranks).

    Args:
        env: The environment variable to read (torchrun's ``LOCAL_RANK`` by default).
        default: The ordinal where ``env`` is not set.

    Returns:
        The device ordinal, below `device_count`.

    Raises:
        ValidationError: ``env``'s value is not an integer, or the ordinal is below 0.
        RuntimeStateError: The ordinal is past the devices this process sees, or there is
            no CUDA driver or GPU.
    """
    op = "tenferro.local_device"
    raw = os.environ.get(env)
    if raw is None:
        ordinal = default
    else:
        try:
            ordinal = int(raw)
        except ValueError:
            raise ValidationError(f"{op}: {env}={raw!r} is not an integer") from None
    if ordinal < 0:
        raise ValidationError(f"{op}: {env}={ordinal} must be >= 0")
    count = device_count()
    if ordinal >= count:
        raise RuntimeStateError(
            f"{op}: {env}={ordinal} but this process sees {count} "
            f"device(s) (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
        )
    return ordinal
