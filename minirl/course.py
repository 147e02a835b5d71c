"""How the course runs: fast mode (CI) or full mode (class), and how many CPU threads torch gets.

The one switch is the environment variable ``MINIRL_FAST``; nothing else in minirl reads it.
Introduced in ``notebooks/00_welcome.ipynb``.

Threads: torch's OpenMP threads spin while they wait for work. On a 2-core laptop with one other busy program, two
spinning threads made the tiny LM's GRPO steps twice as slow as one thread (sampling 3x). With passive waiting
(``OMP_WAIT_POLICY=PASSIVE``) an idle thread sleeps instead, and two threads stay as fast as one under load while
keeping most of their speed-up on an idle machine. OpenMP reads the setting once, when torch is first imported, so
this module sets it on import (``minirl`` imports it before anything that imports torch) unless it is set already,
and ``threads()`` tells whether it took effect.
"""

import os
import sys

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")

_given = os.environ.get("OMP_WAIT_POLICY")
if _given is None:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
# Passive waiting is in effect when it was asked for before torch started, by us (torch not loaded yet) or by the
# environment the process started with (the course's Jupyter kernel and `make test` set it).
PASSIVE_WAIT = (_given or ("PASSIVE" if "torch" not in sys.modules else "")).strip().upper() == "PASSIVE"


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


def threads() -> int:
    """The torch CPU thread count for the language-model half: every core the process may use when waiting threads
    sleep (``PASSIVE_WAIT``), else 1, which never collapses when something else runs on the machine."""
    return max(1, len(os.sched_getaffinity(0))) if PASSIVE_WAIT else 1


def use_threads(n: int = 0) -> int:
    """Set torch's CPU thread count to ``n`` and return the count now in use. ``n = 0`` keeps the current count when
    waiting threads sleep (``PASSIVE_WAIT``: a notebook's own ``torch.set_num_threads`` stands) and sets 1 when they
    spin, which never collapses when something else runs on the machine.

    The LM trainers call it with their ``threads`` field; the LM notebooks call it at the top with ``threads()``.
    """
    import torch  # here, not at the top: this module must load before torch (see above)

    torch.set_num_threads(n or (torch.get_num_threads() if PASSIVE_WAIT else 1))
    return torch.get_num_threads()
