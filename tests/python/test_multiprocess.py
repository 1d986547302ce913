"""nexar's Python API across real processes started by nexar-run: nexar.init() from the
environment, every entry point at 2, 3 and 4 ranks, a killed rank that makes the others
raise instead of hang, and nexar-run --dump during a staged stall naming the rank behind."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

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


@pytest.mark.timing  # elapsed-time bounds (conftest.py)
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


def test_dump_names_the_rank_behind(tmp_path):
    """SIGUSR1 to nexar-run --dump while rank 2 is 4 s late to an all_reduce: one merged file
    with every rank's recorder, naming rank 2 behind on the world communicator; the job then
    completes."""
    out = tmp_path / "dump.json"
    e = dict(os.environ, PYTHONPATH=str(BUILD_PYTHON))
    cmd = [str(NEXAR_RUN), "-n", "3", "--dump", str(out), sys.executable, str(WORKER), "stall", "2"]
    p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        stalled = 0
        lines = []
        while stalled < 2:
            line = p.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
            stalled += "STALLED" in line
        time.sleep(0.5)  # into the all_reduce
        p.send_signal(signal.SIGUSR1)
        rest, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    text = "".join(lines) + rest
    assert p.returncode == 0, text
    dump = json.loads(out.read_text())
    assert [r["world_rank"] for r in dump["ranks"]] == [0, 1, 2], text
    assert dump["behind"]["0x0"] == [2], dump["behind"]
    world = {r["world_rank"]: next(c for c in r["comms"] if c["comm"] == "0x0") for r in dump["ranks"]}
    assert world[0]["called"] == world[1]["called"] == world[2]["called"] + 1
    assert world[0]["ops"][-1]["op"] == "all_reduce" and world[0]["ops"][-1]["state"] == "running"
    assert "in all_reduce #" in dump["ranks"][0]["doing"], dump["ranks"][0]
    assert dump["ranks"][2]["doing"] == "in no operation", dump["ranks"][2]
    assert "behind: world rank 2" in text, text
    for r in range(3):
        assert f"DONE {r}" in text, text
