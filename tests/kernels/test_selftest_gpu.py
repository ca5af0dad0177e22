"""`dsaops kernels selftest` on the GPU (`make test-gpu`): it checks and times dsaops' decode against
SGLang 0.5.23's fp8 kernel (from SGLANG_ROOT, default .devbundle/sgl), writes a verdict the route
command reads, and a planted wrong kernel (DSAOPS_SELFTEST_WRONG_KERNEL=1) keeps SGLang's kernel."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
SGLANG_ROOT = Path(os.environ.get("SGLANG_ROOT", REPO / ".devbundle" / "sgl"))


def dsaops(*args, **env):
    return subprocess.run([sys.executable, "-m", "dsaops", *args], capture_output=True, text=True, timeout=900,
                          env=os.environ | env, check=False)


@pytest.fixture(scope="module")
def root():
    if not (SGLANG_ROOT / "sglang").is_dir():
        pytest.skip(f"no SGLang source at {SGLANG_ROOT} (set SGLANG_ROOT; `make gpu-bundle` puts it in .devbundle/sgl)")
    return str(SGLANG_ROOT)


def selftest(root, out, **env):
    run = dsaops("kernels", "selftest", "--heads", "64", "--batch-sizes", "1,16,64", "--sglang-root", root,
                 "--out", str(out), **env)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    return run.stdout, json.loads(out.read_text())


def test_the_verdict_on_this_gpu_turns_routing_on(root, tmp_path):
    out, verdict = selftest(root, tmp_path / "v.json")
    assert verdict["correct"] and verdict["batch_sizes"] == [1, 16, 64], out
    assert verdict["decision"]["kernel"] == "dsaops", out  # every case measured faster on an H200 (BENCHMARKS.md)
    route = dsaops("kernels", "route", "--target", verdict["target"], "--selftest", str(tmp_path / "v.json"))
    assert route.returncode == 0 and "reason=selftest_passed" in route.stdout, route.stdout + route.stderr


def test_a_planted_wrong_kernel_keeps_sglangs(root, tmp_path):
    out, verdict = selftest(root, tmp_path / "v.json", DSAOPS_SELFTEST_WRONG_KERNEL="1")
    assert not verdict["correct"] and verdict["planted_wrong_kernel"], out
    assert verdict["decision"] == {"kernel": "sglang", "min_batch": None, "reason": "selftest_incorrect"}
    route = dsaops("kernels", "route", "--target", verdict["target"], "--selftest", str(tmp_path / "v.json"),
                   DSAOPS_DECODE="dsaops")
    assert route.stdout.startswith("DSA decode kernel: sglang for every batch size; reason=selftest_incorrect")
