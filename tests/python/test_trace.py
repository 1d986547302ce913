"""Traces and stats of a real job: 4 processes under nexar-run with NEXAR_TRACE, rank 2 late
to every all_reduce. Each rank writes one trace that parses; tools/trace/nexar-trace merges
them onto one timeline and its lateness score names rank 2; each rank's stats count the
all_reduces, and the others' waiting time holds what rank 2 cost them. Over the shared-memory
mailboxes and over QUIC."""

import json
import pathlib
import subprocess
import sys

import pytest

from conftest import ROOT
from test_multiprocess import NEXAR_RUN, WORKER, launch

TOOL = ROOT / "tools" / "trace" / "nexar-trace"

# timing: the lateness score and the waiting times must tell a rank 30 ms late from the
# others, which a neighbouring test's load blurs (conftest.py).
pytestmark = [pytest.mark.skipif(not NEXAR_RUN.exists(), reason=f"{NEXAR_RUN} is not built"),
              pytest.mark.timing]


@pytest.mark.parametrize("shm", ["1", "0"])
def test_a_traced_job_names_its_straggler(tmp_path, shm):
    traces = tmp_path / "traces"
    rc, out = launch(4, WORKER, "slow", 2, env={"NEXAR_TRACE": str(traces), "NEXAR_SHM": shm})
    assert rc == 0, out

    files = sorted(traces.glob("nexar-trace-*.json"))
    assert len(files) == 4, out
    ranks = set()
    for f in files:
        t = json.loads(f.read_text())
        rank = t["otherData"]["rank"]
        ranks.add(rank)
        spans = [e for e in t["traceEvents"] if e.get("cat") == "collective" and e["args"]["op"] == "all_reduce"]
        assert len(spans) == 20, (f, len(spans))
        assert all(e["pid"] == rank and e["args"]["state"] == "done" for e in spans)
    assert ranks == {0, 1, 2, 3}

    merged = tmp_path / "merged.json"
    p = subprocess.run([sys.executable, str(TOOL), "merge", "-o", str(merged), str(traces)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "straggler: rank 2" in p.stdout, p.stdout
    m = json.loads(merged.read_text())
    assert m["otherData"]["lateness"]["straggler"] == 2
    assert min(e["ts"] for e in m["traceEvents"] if e["ph"] == "X") == 0
    assert {e["pid"] for e in m["traceEvents"] if e["ph"] == "X"} == {0, 1, 2, 3}

    stats = {}
    for line in out.splitlines():
        if "STATS " in line:  # nexar-run puts "[rank] " before each line
            rank, body = line.split("STATS ", 1)[1].split(" ", 1)
            stats[int(rank)] = json.loads(body)
    assert sorted(stats) == [0, 1, 2, 3], out
    late_total = 20 * 0.03
    for r, s in stats.items():
        ar = s["ops"]["all_reduce"]
        assert ar["calls"] == 20 and ar["failed"] == 0 and ar["bytes"] == 20 * 4000, ar
        assert 0 <= ar["waiting_seconds"] <= ar["seconds"] + 1e-6, ar
        if r == 2:
            assert ar["waiting_seconds"] < late_total / 2, (r, ar)
        else:
            assert ar["waiting_seconds"] > late_total * 0.6, (r, ar)
        assert sorted(s["peers"]) == [str(q) for q in range(4) if q != r]
        for peer in s["peers"].values():
            assert peer["connected"] and "quic" in peer["links"], peer
            assert ("shm" in peer["links"]) == (shm == "1"), peer
            assert peer["rtt_seconds"] > 0, peer
