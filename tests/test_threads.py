"""How many threads the LM half uses, and whether torch's idle threads sleep (``minirl.course.threads``).

Each case runs in a fresh interpreter: OpenMP reads ``OMP_WAIT_POLICY`` once, when torch is first imported.
"""

import os
import subprocess
import sys

import pytest

PROBE = "import minirl.course as c, os; print(c.PASSIVE_WAIT, c.threads(), os.environ['OMP_WAIT_POLICY'])"
CORES = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "first, given, passive, threads",
    [
        ("", None, True, CORES),  # minirl before torch: minirl sets passive waiting in time, every core is used
        ("import torch; ", None, False, 1),  # torch came first with spinning threads: one thread, safe under load
        ("import torch; ", "PASSIVE", True, CORES),  # the course's kernel and `make test` set it before torch
        ("", "ACTIVE", False, 1),  # a user's own choice is kept
    ],
)
def test_thread_policy(first, given, passive, threads):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run([sys.executable, "-c", first + PROBE], env=env, capture_output=True, text=True, check=True)
    got_passive, got_threads, policy = out.stdout.split()
    assert (got_passive == "True", int(got_threads)) == (passive, threads)
    assert policy == (given or "PASSIVE")


def test_use_threads_sets_the_count_or_keeps_a_safe_one(monkeypatch):
    import torch

    import minirl.course as course

    before = torch.get_num_threads()
    try:
        assert course.use_threads(1) == 1 == torch.get_num_threads()
        monkeypatch.setattr(course, "PASSIVE_WAIT", True)  # sleeping threads: 0 keeps what the caller chose
        torch.set_num_threads(2)
        assert course.use_threads(0) == 2
        monkeypatch.setattr(course, "PASSIVE_WAIT", False)  # spinning threads: 0 means one thread
        assert course.use_threads(0) == 1
    finally:
        torch.set_num_threads(before)
