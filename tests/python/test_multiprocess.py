"""nexar's Python API across real processes started by nexar-run: nexar.init() from the
environment, every entry point at 2, 3 and 4 ranks, and a killed rank that makes the others
raise instead of hang."""

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import BUILD_PYTHON, ROOT

NEXAR_RUN = pathlib.Path(os.environ.get("NEXAR_RUN", ROOT / "build" / "bin" / "nexar-run"))
WORKER = pathlib.Path(__file__).parent / "workers" / "core_worker.py"

pytestmark = pytest.mark.skipif(not NEXAR_RUN.exists(), reason=f"{NEXAR_RUN} is not built")


def launch(n, *args, extra=(), env=None, timeout=120):
    e = dict(os.environ, PYTHONPATH=str(BUILD_PYTHON))
    e.update(env or {})
    cmd = [str(NEXAR_RUN), "-n", str(n), *extra, sys.executable, *map(str, args)]
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("n", (2, 3, 4))
def test_every_entry_point_across_processes(n):
    rc, out = launch(n, WORKER, "check")
    assert rc == 0, out
    for r in range(n):
        assert f"OK {r} {n}" in out, out


@pytest.mark.parametrize("mode,limit", [
    ("kill", 2.0),    # the dead process's port answers ICMP unreachable: at once
    ("freeze", 6.0),  # a silent rank: declared failed after the 2 s failure timeout
])
def test_failed_rank_raises_instead_of_hanging(mode, limit):
    n, victim = 3, 1
    rc, out = launch(n, WORKER, mode, victim, extra=("--on-failure", "continue"),
                     env={"NEXAR_FAILURE_TIMEOUT_MS": "2000"})
    assert rc == 0, out
    for r in range(n):
        if r == victim:
            continue
        line = next((ln for ln in out.splitlines() if f"RAISED {r} " in ln), None)
        assert line is not None, out
        assert float(line.split()[-2]) < limit, line
