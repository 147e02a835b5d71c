"""How the course runs: fast mode (CI) or full mode (class), and how many CPU threads torch gets.

The one switch is the environment variable ``MINIRL_FAST``; nothing else in minirl reads it.
Introduced in ``notebooks/00_welcome.ipynb``.

Threads: torch's OpenMP threads spin while they wait for work. On a 2-core laptop with one other busy program, two
spinning threads made the tiny LM's GRPO steps twice as slow as one thread (sampling 3x). With passive waiting
(``OMP_WAIT_POLICY=PASSIVE``) an idle thread sleeps instead. OpenMP reads the setting once, when torch is first
imported, so this module sets it on import (``minirl`` imports it before anything that imports torch) unless it is set
already, and ``threads()`` tells whether it took effect.

Sleeping threads are not enough on a busy machine: a parallel region ends when its slowest thread does, and a thread
that shares its core with another program waits for the scheduler. So ``threads()`` counts the cores that are idle
when it is called, not all of them (measured on 2 cores with one busy process: a forward and backward pass of the tiny
LM took 2x longer on 2 sleeping threads than on 1; 20 GRPO steps 35 s against 28 s).
"""

import os
import sys
import time

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


def _cpus() -> set[int]:
    """The CPUs this process may run on (all of them where the OS does not say, as on macOS)."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def busy_cores(before: str, after: str, cpus: set[int]) -> float:
    """How many of the CPUs ``cpus`` were busy between two readings of Linux's ``/proc/stat`` (0 to ``len(cpus)``).

    Each ``cpuN`` line counts time since boot in the states user, nice, system, idle, iowait, irq, softirq, steal
    (then guest time, already inside user); idle and iowait are the idle states."""

    def times(stat: str) -> dict[int, tuple[int, int]]:  # cpu -> (all time, idle time)
        out = {}
        for line in stat.splitlines():
            name, *fields = line.split() or [""]
            if name[:3] == "cpu" and name[3:].isdigit() and int(name[3:]) in cpus:  # not the machine-wide "cpu" line
                ticks = [int(x) for x in fields[:8]]
                out[int(name[3:])] = (sum(ticks), ticks[3] + ticks[4])
        return out

    t0, t1 = times(before), times(after)
    busy = 0.0
    for cpu in t0.keys() & t1.keys():
        total, idle = t1[cpu][0] - t0[cpu][0], t1[cpu][1] - t0[cpu][1]
        busy += (total - idle) / total if total > 0 else 0.0
    return busy


def idle_cores(interval: float = 0.2) -> float | None:
    """Cores of this process's CPU set that no program used over the next ``interval`` seconds; None where
    ``/proc/stat`` does not exist (not Linux)."""
    cpus = _cpus()
    try:
        with open("/proc/stat") as f:
            before = f.read()
        time.sleep(interval)
        with open("/proc/stat") as f:
            after = f.read()
    except OSError:
        return None
    return len(cpus) - busy_cores(before, after, cpus)


def threads() -> int:
    """The torch CPU thread count for the language-model half: one per idle core when waiting threads sleep
    (``PASSIVE_WAIT``), at least 1; else 1, which never collapses when something else runs on the machine. Where idle
    cores cannot be measured (not Linux), every core the process may use."""
    if not PASSIVE_WAIT:
        return 1
    cores = len(_cpus())
    idle = idle_cores()
    return cores if idle is None else max(1, min(cores, round(idle)))


def use_threads(n: int = 0) -> int:
    """Set torch's CPU thread count to ``n`` and return the count now in use. ``n = 0`` keeps the current count when
    waiting threads sleep (``PASSIVE_WAIT``: a notebook's own ``torch.set_num_threads`` stands) and sets 1 when they
    spin, which never collapses when something else runs on the machine.

    The LM trainers call it with their ``threads`` field; the LM notebooks call it at the top with ``threads()``.
    """
    import torch  # here, not at the top: this module must load before torch (see above)

    torch.set_num_threads(n or (torch.get_num_threads() if PASSIVE_WAIT else 1))
    return torch.get_num_threads()
