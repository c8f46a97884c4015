import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    """These tests run on tiny tensors: one intra-op thread avoids oversubscribing shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
