"""The Python example and the DDP benchmark still run (tiny sizes: a smoke test, not a
measurement)."""

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import BUILD_PYTHON, ROOT

pytest.importorskip("torch")
NEXAR_RUN = pathlib.Path(os.environ.get("NEXAR_RUN", ROOT / "build" / "bin" / "nexar-run"))
pytestmark = pytest.mark.skipif(
    not NEXAR_RUN.exists() or not list(BUILD_PYTHON.glob("nexar/_torch*.so")),
    reason="needs nexar-run and the torch backend")


def run(n, script, *args):
    env = dict(os.environ, PYTHONPATH=str(BUILD_PYTHON), OMP_NUM_THREADS="1")
    p = subprocess.run([str(NEXAR_RUN), "-n", str(n), sys.executable, str(script), *args],
                       env=env, capture_output=True, text=True, timeout=180)
    return p.returncode, p.stdout + p.stderr


def test_ddp_train_example_matches_gloo():
    rc, out = run(2, ROOT / "examples" / "python" / "ddp_train.py", "--epochs", "2",
                  "--steps", "4", "--compare-gloo")
    assert rc == 0, out
    assert "identical on all 2 ranks: True" in out, out
    assert "(<= 1e-5: True)" in out, out
    assert out.count("epoch 2 loss") == 2, out


def test_ddp_step_benchmark_runs():
    rc, out = run(2, ROOT / "bench" / "ddp_step.py", "--width", "64", "--layers", "2",
                  "--steps", "1", "--warmup", "0")
    assert rc == 0, out
    assert "nexar" in out and "gloo" in out and "all_reduce share" in out, out
