"""Fixtures shared by the test files."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Run a test at one torch thread (faster for small MLPs, and the thread count the benchmarks use)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
