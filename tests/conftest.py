"""Shared test plumbing: the `gpu` marker, and parts that CI must have."""

import pytest


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here: run `make test-gpu` on the H200 machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
