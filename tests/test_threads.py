"""How many threads the LM half uses, and whether torch's idle threads sleep (``minirl.course.threads``).

Each case runs in a fresh interpreter: OpenMP reads ``OMP_WAIT_POLICY`` once, when torch is first imported.
"""

import os
import subprocess
import sys
import time

import pytest

# every core counts as idle in the probe, so the expected count does not depend on what else runs on the machine;
# measuring idle cores is tested below
PROBE = (
    "import minirl.course as c, os; c.idle_cores = lambda: float(len(c._cpus())); "
    "print(c.PASSIVE_WAIT, c.threads(), os.environ['OMP_WAIT_POLICY'])"
)
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


STAT = "cpu  {all}\ncpu0 {c0}\ncpu1 {c1}\nintr 1 2 3\n"  # /proc/stat: user nice system idle iowait irq softirq steal


def test_busy_cores_counts_the_time_each_cpu_was_not_idle():
    from minirl.course import busy_cores

    before = STAT.format(all="0 " * 10, c0="100 0 50 1000 10 0 0 0 0 0", c1="100 0 0 1000 0 0 0 0 0 0")
    # 100 ticks later: cpu0 spent them all in user and system, cpu1 half in user and half idle or waiting on disk
    after = STAT.format(all="9 " * 10, c0="180 0 70 1000 10 0 0 0 0 0", c1="150 0 0 1040 10 0 0 0 0 0")
    assert busy_cores(before, after, {0, 1}) == pytest.approx(1.5)
    assert busy_cores(before, after, {1}) == pytest.approx(0.5)  # only the CPUs this process may use count
    assert busy_cores(before, before, {0, 1}) == 0.0  # no time passed: nothing was busy


@pytest.mark.skipif(CORES < 2 or not os.path.exists("/proc/stat"), reason="needs Linux and 2 cores")
def test_threads_leaves_a_busy_core_to_its_program():
    import minirl.course as course

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # the interpreter has started and spins
        assert course.idle_cores() <= CORES - 0.7
        if course.PASSIVE_WAIT:
            assert course.threads() <= CORES - 1
    finally:
        spin.kill()
        spin.wait()


def test_threads_uses_every_core_where_idle_cores_cannot_be_measured(monkeypatch):
    import minirl.course as course

    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # as on macOS
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert course._cpus() == set(range(6))
    monkeypatch.setattr(course, "idle_cores", lambda interval=0.2: None)  # no /proc/stat
    monkeypatch.setattr(course, "PASSIVE_WAIT", True)
    assert course.threads() == 6
    monkeypatch.setattr(course, "PASSIVE_WAIT", False)
    assert course.threads() == 1
