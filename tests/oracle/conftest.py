"""Shared fixtures of the oracle tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def single_thread():
    """Run on one intra-op thread: on a small, shared machine a thread pool's hand-offs cost far
    more than the tiny ops of these models. exact-v1 bytes do not depend on the thread count
    (test_device_independence walks with 2 threads too)."""
    import numba
    import torch

    n_torch, n_numba = torch.get_num_threads(), numba.get_num_threads()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    yield
    torch.set_num_threads(n_torch)
    numba.set_num_threads(n_numba)
