"""Shared fixtures of nexar's Python tests.

The package under test is the one the CMake build put in build/python (scripts/test.sh
sets PYTHONPATH to it; NEXAR_PYTHON_PATH overrides). Ranks of one process run on threads:
nexar's blocking calls release the GIL, so the threads really run side by side.
"""

import os
import pathlib
import sys
import threading

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_PYTHON = pathlib.Path(os.environ.get("NEXAR_PYTHON_PATH", ROOT / "build" / "python"))
if str(BUILD_PYTHON) not in sys.path:
    sys.path.insert(0, str(BUILD_PYTHON))

import nexar  # noqa: E402

SIZES = (1, 2, 3, 4)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "timing: judges elapsed or waiting times; scripts/test.sh runs these "
        "alone, after the others ran two at a time (pytest -n 2)")


def short_config():
    """Short deadlines, so that a test that would hang fails in seconds instead."""
    c = nexar.Config.from_env()
    c.op_timeout = 30
    c.rpc_timeout = 10
    return c


@pytest.fixture(scope="session")
def worlds():
    """One in-process world of each size 1..4 (ranks connected over QUIC on loopback),
    shared by every test: bootstrapping costs more than most tests."""
    made = {n: nexar.bootstrap_local(n, short_config()) for n in SIZES}
    yield made
    for comms in made.values():
        for c in comms:
            c.close()


def run_ranks(comms, fn, timeout=60.0):
    """Runs fn(comm) for every rank on a thread of its own; returns the results in rank
    order, re-raising the first exception (with its rank) or failing on a hang."""
    results = [None] * len(comms)
    errors = [None] * len(comms)

    def body(i):
        try:
            results[i] = fn(comms[i])
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            errors[i] = e

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(comms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            pytest.fail(f"a rank did not finish within {timeout} s")
    for i, e in enumerate(errors):
        if e is not None:
            raise AssertionError(f"rank {i} failed: {type(e).__name__}: {e}") from e
    return results
