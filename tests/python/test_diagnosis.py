"""Diagnosis from Python: the flight recorder (Communicator.recorder() and dump()) lists the
collectives each rank called, in order, with their calls and states; and with
Config.stall_warn set, a rank that skips a collective is named in the timeout of every rank
that waited for it."""

import contextlib
import json
import time

import numpy as np
import pytest

import nexar
from conftest import run_ranks, short_config


@contextlib.contextmanager
def local_world(n, cfg):
    comms = nexar.bootstrap_local(n, cfg)
    try:
        yield comms
    finally:
        for c in comms:
            c.close()


def own_calls(records):
    """The application's calls: the library's own collectives (the members' vote on the
    shared-memory mailboxes) are recorded too."""
    return [r for r in records if r["op"] != "mailbox vote"]


@pytest.mark.parametrize("shm", [False, True], ids=["quic", "shm"])
def test_the_recorder_lists_each_call(shm):
    cfg = short_config()
    cfg.shm = shm
    before = time.monotonic()

    def body(c):
        for _ in range(4):
            c.all_reduce(np.arange(7, dtype=np.float32), op=nexar.MAX)
        c.broadcast(np.zeros(5, dtype=np.int64), root=2)
        c.barrier()
        return c.recorder(), json.loads(c.dump())

    with local_world(3, cfg) as comms:
        results = run_ranks(comms, body)
    for rank, (records, dump) in enumerate(results):
        calls = own_calls(records)
        assert [r["op"] for r in calls] == ["all_reduce"] * 4 + ["broadcast", "barrier"]
        numbers = [r["number"] for r in records]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        ar, bc = calls[3], calls[4]
        assert (ar["dtype"], ar["reduce_op"], ar["count"], ar["bytes"], ar["root"]) == ("f32", "max", 7, 28, -1)
        assert (bc["dtype"], bc["count"], bc["bytes"], bc["root"]) == ("i64", 5, 40, 2)
        for r in records:
            assert r["state"] == "done"
            assert before <= r["posted"] <= r["started"] <= r["ended"] <= time.monotonic()
        assert dump["rank"] == rank and dump["size"] == 3 and dump["comm"] == "0x0"
        assert dump["called"] == dump["completed"] == numbers[-1] + 1
        assert [o["op"] for o in dump["ops"]] == [r["op"] for r in records]


def test_an_empty_recorder_still_counts():
    cfg = short_config()
    cfg.recorder_ops = 0
    with local_world(2, cfg) as comms:
        dumps = run_ranks(comms, lambda c: (c.barrier(), c.recorder(), json.loads(c.dump()))[1:])
    for records, dump in dumps:
        assert records == [] and dump["ops"] == []
        assert dump["called"] == dump["completed"] >= 1


def test_a_skipped_collective_is_named_in_the_timeout():
    cfg = short_config()
    cfg.stall_warn = 0.3

    def body(c):
        if c.rank == 2:
            time.sleep(2.5)
            return None
        with pytest.raises(nexar.TimeoutError) as e:
            c.all_reduce(np.ones(3, dtype=np.float64), timeout=2)
        return str(e.value)

    with local_world(3, cfg) as comms:
        run_ranks(comms, lambda c: c.barrier())
        texts = run_ranks(comms, body)[:2]
    for rank, text in enumerate(texts):
        assert "stall: all_reduce #" in text and "(f64, 3 elements, sum)" in text, text
        assert f"on rank {rank} of 3" in text, text
        assert "not called by rank 2 (last completed #" in text and "in no operation)" in text, text
