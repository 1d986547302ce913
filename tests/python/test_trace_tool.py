"""Tests of tools/trace/nexar-trace (merge of per-rank traces, lateness score).

The tool is plain Python with no dependency on the nexar module; it is loaded from its
file because it has no .py suffix. The traces are synthetic: each rank gets its own
arbitrary clock zero, and every collective ends at the same true moment on all ranks,
so the merge must make those ends coincide.
"""

import importlib.machinery
import importlib.util
import json
import pathlib
import random
import subprocess
import sys

import pytest

TOOL = pathlib.Path(__file__).resolve().parent / ".." / ".." / "tools" / "trace" / "nexar-trace"


def _load_tool():
    loader = importlib.machinery.SourceFileLoader("nexar_trace_tool", str(TOOL))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


nt = _load_tool()

EPOCH_US = 1_780_000_000_000_000.0
WORLD = 4
COLLECTIVES = 50
SLOW_US = 20_000.0


def make_traces(directory, world=WORLD, slow=2, seed=1, pid_base=4000, extra=None):
    """Writes one trace file per rank into directory and returns their paths.

    slow: the rank that arrives SLOW_US late at every collective (None: nobody).
    extra: {rank: [events]} appended to that rank's file (times in true microseconds
    from the start, converted to the rank's own clock here)."""
    rng = random.Random(seed)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # Each process starts at its own moment; its steady zero is that moment. Rounded to
    # whole microseconds so that EPOCH_US + zero is exact as a double.
    zeros = [float(rng.randrange(0, 5_000_000)) for _ in range(world)]
    events = {r: [] for r in range(world)}
    t = 10_000_000.0  # true time (us after EPOCH_US) of the first collective
    for seq in range(COLLECTIVES):
        end = t + 50_000.0
        for r in range(world):
            arrive = t + rng.uniform(0, 200) + (SLOW_US if r == slow else 0.0)
            wait = (end - arrive) * 0.9
            events[r].append(_x("wait", "wait for peers", r, 1, arrive + 1.0, wait))
            events[r].append(_x("collective", f"all_reduce #{seq}", r, 1, arrive, end - arrive,
                                comm="0x0", seq=seq, op="all_reduce", dtype="f32", count=1000,
                                bytes=4000, reduce="sum", root=-1, algorithm="ring",
                                state="done", waiting_us=wait))
        # a little point-to-point traffic between the collectives
        for r in range(world):
            peer = (r + 1) % world
            events[r].append(_x("p2p", f"send to {peer}", r, 0, end + 1000.0, 300.0,
                                comm="0x0", peer=peer, tag=5, bytes=4096, state="done"))
        t = end + 10_000.0
    for r, evs in (extra or {}).items():
        events[r].extend(evs)

    paths = []
    for r in range(world):
        pid = pid_base + r
        for ev in events[r]:
            ev["ts"] -= zeros[r]  # true time -> this rank's steady clock
        meta = [{"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}},
                {"ph": "M", "name": "thread_name", "pid": r, "tid": 0,
                 "args": {"name": "point-to-point"}},
                {"ph": "M", "name": "thread_name", "pid": r, "tid": 1,
                 "args": {"name": "communicator 0x0"}}]
        doc = {"traceEvents": meta + events[r], "displayTimeUnit": "ms",
               "otherData": {"nexar_trace": 1, "rank": r, "world": world, "pid": pid,
                             "host": "host", "unix_us_at_zero": EPOCH_US + zeros[r]}}
        path = directory / f"nexar-trace-{r}-{pid}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    return paths


def _x(cat, name, rank, tid, ts, dur, **args):
    ev = {"ph": "X", "cat": cat, "name": name, "pid": rank, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = args
    return ev


def _input_events(paths):
    return sum(len(json.loads(p.read_text())["traceEvents"]) for p in paths)


def test_merge_aligns_ranks_and_names_straggler(tmp_path, capsys):
    paths = make_traces(tmp_path / "in")
    out = tmp_path / "merged.json"
    assert nt.main(["merge", "-o", str(out), str(tmp_path / "in")]) == 0
    printed = capsys.readouterr().out
    assert "straggler: rank 2 (arrived last in 50 of 50 collectives" in printed
    assert f"wrote {out}" in printed

    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    assert len(events) == _input_events(paths)
    phases = [ev["ph"] for ev in events]
    assert phases == sorted(phases, key=lambda ph: ph != "M")  # metadata first
    timed = [ev for ev in events if ev["ph"] == "X"]
    assert min(ev["ts"] for ev in timed) == pytest.approx(0.0, abs=1e-6)
    assert {ev["pid"] for ev in events} == set(range(WORLD))

    # every collective ended at one true moment on all ranks; after alignment the ends agree
    ends = {}
    for ev in timed:
        if ev["cat"] == "collective":
            ends.setdefault(ev["args"]["seq"], []).append(ev["ts"] + ev["dur"])
    assert len(ends) == COLLECTIVES
    for seq, values in ends.items():
        assert len(values) == WORLD
        assert max(values) - min(values) < 1.0, seq

    other = doc["otherData"]
    assert other["nexar_trace_merged"] == 1
    assert [r["rank"] for r in other["ranks"]] == list(range(WORLD))
    assert other["lateness"]["straggler"] == 2
    assert doc["displayTimeUnit"] == "ms"


def test_lateness_scores(tmp_path):
    score = nt.lateness(nt.load_all([str(p) for p in make_traces(tmp_path)]))
    assert score["straggler"] == 2
    slow = score["ranks"]["2"]
    assert slow["collectives"] == COLLECTIVES and slow["last"] == COLLECTIVES
    assert 19.8 <= slow["median_late_ms"] <= 20.2  # 20 ms give or take the 0.2 ms jitter
    assert 19.8 <= slow["mean_late_ms"] <= 20.2
    for r in (0, 1, 3):
        assert score["ranks"][str(r)]["last"] == 0
        assert score["ranks"][str(r)]["median_late_ms"] < 0.2


def test_no_straggler_among_equal_ranks(tmp_path, monkeypatch, capsys):
    make_traces(tmp_path / "in", slow=None)
    monkeypatch.chdir(tmp_path)
    assert nt.main(["lateness", "in"]) == 0
    printed = capsys.readouterr().out
    assert "no straggler stands out" in printed
    assert printed.startswith("rank  collectives  last  median late ms  mean late ms\n")
    assert not (tmp_path / nt.DEFAULT_OUT).exists()  # lateness writes no merged file
    assert nt.lateness(nt.load_all(["in"]))["straggler"] is None


def test_single_rank_group_and_failed_collective_ignored(tmp_path):
    # seq 900 seen only by rank 1 (a huge span); seq 901 failed on every rank, with rank 0
    # far shorter. Neither may count, so nobody stands out and every rank has 50.
    lone = {1: [_x("collective", "all_reduce #900", 1, 1, 1e9, 9e6, comm="0x0", seq=900,
                   state="done")]}
    failed = {r: [_x("collective", "all_reduce #901", r, 1, 2e9, 1e3 if r == 0 else 9e5,
                     comm="0x0", seq=901, state="failed")] for r in range(WORLD)}
    extra = {r: lone.get(r, []) + failed[r] for r in range(WORLD)}
    score = nt.lateness(nt.load_all([str(p) for p in make_traces(tmp_path, slow=None,
                                                                  extra=extra)]))
    assert score["straggler"] is None
    for r in range(WORLD):
        assert score["ranks"][str(r)]["collectives"] == COLLECTIVES
    assert score["ranks"]["0"]["last"] < COLLECTIVES


def test_bad_files_exit_2_and_name_the_file(tmp_path, capsys):
    make_traces(tmp_path / "in")
    bad = tmp_path / "in" / "nexar-trace-9-1.json"
    bad.write_text("{not json")
    assert nt.main(["merge", "-o", str(tmp_path / "m.json"), str(tmp_path / "in")]) == 2
    assert str(bad) in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()

    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"traceEvents": [], "otherData": {"rank": 0}}))
    assert nt.main(["lateness", str(foreign)]) == 2
    err = capsys.readouterr().err
    assert str(foreign) in err and "nexar_trace" in err

    assert nt.main(["merge", str(tmp_path / "missing")]) == 2
    assert nt.main(["merge"]) == 2  # usage error


def test_directory_takes_only_trace_files(tmp_path, monkeypatch, capsys):
    paths = make_traces(tmp_path / "in")
    (tmp_path / "in" / "other.json").write_text("{not json")
    (tmp_path / "in" / "notes.txt").write_text("hello")
    (tmp_path / "in" / "nexar-trace-merged.json.bak").write_text("{")
    monkeypatch.chdir(tmp_path)
    assert nt.main(["merge", "in"]) == 0  # default output in the current directory
    doc = json.loads((tmp_path / nt.DEFAULT_OUT).read_text())
    assert len(doc["otherData"]["ranks"]) == WORLD
    assert len(doc["traceEvents"]) == _input_events(paths)
    assert nt.expand([str(tmp_path / "in")]) == [str(p) for p in sorted(paths)]


def test_duplicate_ranks_get_distinct_pids(tmp_path):
    first = make_traces(tmp_path / "a", seed=1, pid_base=4000)
    second = make_traces(tmp_path / "b", seed=2, pid_base=7000)
    # make job b's processes younger, so job a keeps the plain pids
    for p in second:
        doc = json.loads(p.read_text())
        doc["otherData"]["unix_us_at_zero"] += 60e6
        p.write_text(json.dumps(doc))
    doc = nt.merge(nt.load_all([str(tmp_path / "a"), str(tmp_path / "b")]))
    pids = {ev["pid"] for ev in doc["traceEvents"]}
    assert pids == set(range(WORLD)) | {r + 1000 for r in range(WORLD)}
    names = {ev["pid"]: ev["args"]["name"] for ev in doc["traceEvents"]
             if ev["ph"] == "M" and ev["name"] == "process_name"}
    assert names[1] == "rank 1"
    assert names[1001] == "rank 1 (pid 7001)"
    assert len(doc["traceEvents"]) == _input_events(first + second)
    shown = [(r["rank"], r["pid"], r["process"]) for r in doc["otherData"]["ranks"]]
    assert (3, 1003, 7003) in shown and (3, 3, 4003) in shown
    # both jobs' collectives share (comm, seq) but are scored under their own pids
    late = doc["otherData"]["lateness"]["ranks"]
    assert set(late) == {str(p) for p in pids}


def test_runs_as_a_script(tmp_path):
    make_traces(tmp_path)
    out = tmp_path / "m.json"
    done = subprocess.run([sys.executable, str(TOOL), "merge", "-o", str(out), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "straggler: rank 2" in done.stdout
    assert json.loads(out.read_text())["otherData"]["nexar_trace_merged"] == 1
