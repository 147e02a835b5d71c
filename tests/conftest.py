"""Fixtures shared by the test files."""

import pytest
import torch


def at_threads(n: int):
    """Set torch's thread count to ``n`` for the test, and give the previous count back after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def one_thread():
    """Run a test at one torch thread (faster for small MLPs, and the thread count the benchmarks use)."""
    yield from at_threads(1)


@pytest.fixture
def two_threads():
    """Run a test at two torch threads, as the course does on an idle 2-core laptop."""
    yield from at_threads(2)
