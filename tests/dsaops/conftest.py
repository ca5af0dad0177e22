"""A copy of the pinned wheel with the dsaops patch series applied (`dsaops patches apply`),
made once per session: the planner and the boot gate describe the patched image."""
import pytest

from dsaops.cli import main
from tests.support.sglang_wheel import pristine_copy


@pytest.fixture(scope="session")
def patched_root(tmp_path_factory):
    root = pristine_copy(tmp_path_factory.mktemp("patched-sglang"))
    assert main(["patches", "apply", "--sglang-root", str(root)]) == 0
    return root
