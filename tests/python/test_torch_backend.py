"""The torch.distributed backend "nexar": every operation and a few DDP steps under torchrun
(env://, torch's store) and under nexar-run (nexar's own launch variables), a killed rank
that makes the others' all_reduce raise instead of hang, and a rank whose all_reduce takes
another dtype (the same bytes) that makes every rank raise, naming both calls."""

import os
import pathlib
import socket
import subprocess
import sys

import pytest

from conftest import BUILD_PYTHON, ROOT

torch = pytest.importorskip("torch")
if not list(BUILD_PYTHON.glob("nexar/_torch*.so")):
    pytest.skip("nexar._torch was not built (libtorch not found)", allow_module_level=True)

NEXAR_RUN = pathlib.Path(os.environ.get("NEXAR_RUN", ROOT / "build" / "bin" / "nexar-run"))
WORKER = pathlib.Path(__file__).parent / "workers" / "torch_worker.py"


def env(**extra):
    e = dict(os.environ, PYTHONPATH=str(BUILD_PYTHON), OMP_NUM_THREADS="1")
    e.update(extra)
    return e


def run(cmd, timeout=180, **extra):
    p = subprocess.run(cmd, env=env(**extra), capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_under_torchrun():
    # Debian's torch 1.13: options with underscores; -r 1 -t 1 avoids a crash of its launcher
    # under Python 3.11 (to_map on an IntFlag).
    rc, out = run([sys.executable, "-m", "torch.distributed.run", "-r", "1", "-t", "1",
                   "--nproc_per_node", "4", "--master_addr", "127.0.0.1",
                   "--master_port", str(free_port()), str(WORKER), "check"])
    assert rc == 0, out
    for r in range(4):
        assert f"TORCH OK {r} 4" in out, out


@pytest.mark.skipif(not NEXAR_RUN.exists(), reason="nexar-run is not built")
def test_under_nexar_run():
    rc, out = run([str(NEXAR_RUN), "-n", "4", sys.executable, str(WORKER), "check"])
    assert rc == 0, out
    for r in range(4):
        assert f"TORCH OK {r} 4" in out, out


@pytest.mark.skipif(not NEXAR_RUN.exists(), reason="nexar-run is not built")
def test_killed_rank_raises():
    n, victim = 3, 2
    rc, out = run([str(NEXAR_RUN), "-n", str(n), "--on-failure", "continue", sys.executable,
                   str(WORKER), "kill", str(victim)], NEXAR_FAILURE_TIMEOUT_MS="2000")
    assert rc == 0, out
    for r in range(n - 1):
        line = next((ln for ln in out.splitlines() if f"RAISED {r} " in ln), None)
        assert line is not None, out
        assert float(line.split()[-1]) < 6, line


@pytest.mark.parametrize("n", [3, 4])
def test_timeouts(n):
    rc, out = run([sys.executable, "-m", "torch.distributed.run", "-r", "1", "-t", "1",
                   "--nproc_per_node", str(n), "--master_addr", "127.0.0.1",
                   "--master_port", str(free_port()), str(WORKER), "timeouts"])
    assert rc == 0, out
    for r in range(n):
        assert f"TIMEOUTS OK {r} {n}" in out, out


@pytest.mark.parametrize("shm", ["1", "0"])
def test_dtype_mismatch_raises_on_every_rank(shm):
    n = 3
    rc, out = run([sys.executable, "-m", "torch.distributed.run", "-r", "1", "-t", "1",
                   "--nproc_per_node", str(n), "--master_addr", "127.0.0.1",
                   "--master_port", str(free_port()), str(WORKER), "mismatch"], NEXAR_SHM=shm)
    assert rc == 0, out
    for r in range(n):
        assert f"MISMATCH OK {r} {n}" in out, out
