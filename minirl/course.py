"""How the course runs: fast mode (CI) or full mode (class).

The one switch is the environment variable ``MINIRL_FAST``; nothing else in minirl reads it.
Introduced in ``notebooks/00_welcome.ipynb``.
"""

import os

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def fast_mode() -> bool:
    """True when ``MINIRL_FAST`` asks for the short CI budgets, False for the full class budgets."""
    value = os.environ.get("MINIRL_FAST", "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"MINIRL_FAST must be one of {_TRUE + _FALSE[1:]}, got {value!r}")


def budget(fast, full):
    """``fast`` in fast mode, ``full`` otherwise: ``steps = budget(fast=2_000, full=100_000)``."""
    return fast if fast_mode() else full
