"""Repository-wide pytest configuration: markers shared by every package's tests."""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA or ROCm GPU (run by the nox 'gpu' session)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds on CPU")
    config.addinivalue_line("markers", "distributed: starts several processes (torch.distributed)")
