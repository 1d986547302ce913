"""PyTorch's own distributed test suite (torch 1.13's DistributedTest._DistTestBase) on
backend "nexar": the subset of tests/python/torch_suite/subset.txt at 3 ranks, selected as
for Gloo (scripts/torch_suite.sh; the whole suite is `scripts/torch_suite.sh` without
--subset, at --world 3 or 4)."""

import subprocess

import pytest

from conftest import BUILD_PYTHON, ROOT

pytest.importorskip("torch")
if not list(BUILD_PYTHON.glob("nexar/_torch*.so")):
    pytest.skip("nexar._torch was not built (libtorch not found)", allow_module_level=True)


def test_torch_suite_subset():
    p = subprocess.run(["bash", str(ROOT / "scripts" / "torch_suite.sh"), "--subset", "--world", "3"],
                       capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    summary = [ln for ln in out.splitlines() if ln.endswith("skipped") and " passed, " in ln]
    assert p.returncode == 0 and summary, out[-6000:]
    passed, failed = (int(summary[-1].split(", ")[i].split()[0]) for i in (0, 1))
    assert failed == 0 and passed >= 30, summary[-1]
