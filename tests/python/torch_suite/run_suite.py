"""Runs PyTorch's own distributed test suite (torch 1.13's DistributedTest._DistTestBase,
as test/distributed/test_distributed_spawn.py does) against gloo or nexar.

Usage (scripts/torch_suite.sh wraps this with the right interpreter and paths):

    /usr/bin/python3 tests/python/torch_suite/run_suite.py [--backend gloo|nexar] [--world N]
        [--subset] [--names-file FILE] [-k PATTERN]... [--timeout S] [--start fork|spawn]
        [--pass-file FILE] [--results-file FILE] [--list] [TEST_NAME ...]

It ends with the line "N passed, N failed, N skipped" and exits non-zero when anything
failed. Errors count as failures, expected failures as passes.

How it works. Every test runs in WORLD_SIZE processes. By default they are forked from
this process, which imported torch once and never makes a process group itself, so each
test costs its own work and not WORLD_SIZE imports of torch: the 38 tests of the subset
take about 37 s instead of about 185 s. --start spawn starts them as
test_distributed_spawn.py does: each child imports this file again (as __mp_main__).
Either way everything the children need is set up at import time from environment
variables, which the parent fills in from its command line before any child starts:

    TORCH_SUITE_BACKEND  gloo | nexar          WORLD_SIZE  ranks per test
    TEMP_DIR, INIT_METHOD  (as torch's suite expects; torch re-creates TEMP_DIR per test)
    DISTRIBUTED_TESTS_DEFAULT_TIMEOUT  seconds before a test's processes are killed
    TORCH_SUITE_NO_NEXAR_SKIPS, TORCH_SUITE_VERBOSE  (--no-nexar-skips, --verbose)
    TORCH_SUITE_START  fork | spawn  (--start)

torch's suite picks its tests at import time with decorators that only know gloo, nccl,
mpi and ucc (sandcastle_skip_if(BACKEND != "gloo", ...) and the like). So BACKEND=gloo is
in the environment while distributed_test is imported, whatever the backend: the tests are
selected exactly as for gloo. For nexar the module global distributed_test.BACKEND is then
set to "nexar" (init_process_group, test_get_backend and the body checks read that global)
and nexar.torch is imported, which registers the backend. os.environ["BACKEND"] stays
"gloo": torch only compares it with "nccl" and "mpi" at run time, which holds either way.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import pathlib
import sys
import tempfile
import time
import traceback
import unittest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]

# The expecttest stand-in next to this file (torch's common_utils imports expecttest).
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
# The nexar package as the CMake build lays it out (NEXAR_PYTHON_PATH overrides).
_nexar_path = os.environ.get("NEXAR_PYTHON_PATH", str(ROOT / "build" / "python"))
if os.path.isdir(_nexar_path) and _nexar_path not in sys.path:
    sys.path.insert(0, _nexar_path)

BACKENDS = ("gloo", "nexar")

# Tests that cannot be meaningful for nexar although gloo's selection runs them: their
# bodies branch on the backend's name (not just their decorators), or they need
# monitored_barrier, which torch 1.13's Python front end refuses for anything but gloo
# ("monitored_barrier is only implemented for GLOO backend."). Tests that only need a GPU
# are not listed: they skip here for every backend.
NEXAR_SKIPS = {
    "test_accumulate_gradients_no_sync":
        "_test_accumulate_gradients_no_sync builds its DDP model only if BACKEND is mpi/gloo/nccl",
    "test_accumulate_gradients_no_sync_grad_is_view":
        "same helper: the model exists only under BACKEND == 'mpi'/'gloo'/'nccl'",
    "test_accumulate_gradients_no_sync_allreduce_hook":
        "same helper: the model exists only under BACKEND == 'mpi'/'gloo'/'nccl'",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook":
        "same helper: the model exists only under BACKEND == 'mpi'/'gloo'/'nccl'",
    "test_monitored_barrier_gloo":
        "dist.monitored_barrier on the default group: gloo only in torch 1.13",
    "test_monitored_barrier_gloo_subgroup":
        "dist.monitored_barrier on a default-backend subgroup: gloo only in torch 1.13",
    "test_monitored_barrier_gloo_rank_0_timeout":
        "ProcessGroup.monitored_barrier on a default-backend group: a ProcessGroupGloo method",
    "test_monitored_barrier_failure_order":
        "dist.monitored_barrier on the default group: gloo only in torch 1.13",
    "test_monitored_barrier_wait_all_ranks":
        "dist.monitored_barrier on the default group: gloo only in torch 1.13",
}


def _parse_cli():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=BACKENDS,
                   default=os.environ.get("TORCH_SUITE_BACKEND", "gloo"))
    p.add_argument("--world", type=int, default=int(os.environ.get("WORLD_SIZE", "3")),
                   help="ranks per test (default: $WORLD_SIZE or 3)")
    p.add_argument("--subset", action="store_true",
                   help="run the names listed in subset.txt next to this file")
    p.add_argument("--names-file", action="append", default=[],
                   help="run the names listed in FILE (one a line, # comments)")
    p.add_argument("-k", dest="patterns", action="append", default=[],
                   help="only tests whose name contains PATTERN (fnmatch if it has * ? [)")
    p.add_argument("--timeout", type=int,
                   default=int(os.environ.get("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "180")),
                   help="seconds before one test's processes are killed (default 180)")
    p.add_argument("--start", choices=("fork", "spawn"),
                   default=os.environ.get("TORCH_SUITE_START", "fork"),
                   help="how each test's processes start (default fork; spawn as torch's own "
                        "test_distributed_spawn.py, slower: every child imports torch)")
    p.add_argument("--pass-file", help="write the names of the passed tests here")
    p.add_argument("--results-file", help="write 'name<TAB>outcome<TAB>seconds' lines here")
    p.add_argument("--no-nexar-skips", action="store_true",
                   help="also run the tests of NEXAR_SKIPS under nexar")
    p.add_argument("--list", action="store_true", help="list the selected tests and exit")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="keep torch's INFO logging (process starts, store barriers)")
    p.add_argument("names", nargs="*", help="test names (test_x or Class.test_x)")
    args = p.parse_args()
    if args.world < 2:
        p.error("--world must be at least 2")
    return args


if __name__ == "__main__":
    CLI = _parse_cli()
    os.environ["TORCH_SUITE_BACKEND"] = CLI.backend
    os.environ["WORLD_SIZE"] = str(CLI.world)
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(CLI.timeout)
    os.environ["TORCH_SUITE_START"] = CLI.start
    if CLI.no_nexar_skips:
        os.environ["TORCH_SUITE_NO_NEXAR_SKIPS"] = "1"
    if CLI.verbose:
        os.environ["TORCH_SUITE_VERBOSE"] = "1"
    if not os.environ.get("TEMP_DIR"):
        os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="torch_suite_")
    os.environ.setdefault(
        "INIT_METHOD", "file://" + os.path.join(os.environ["TEMP_DIR"], "init_file"))
    # torch's common_utils parses sys.argv when it is imported; it must not see ours.
    # The children get this same argv from the parent.
    sys.argv = sys.argv[:1]

# ---- from here on, the parent and every child (re-importing this file) run the same ----

SUITE_BACKEND = os.environ.get("TORCH_SUITE_BACKEND", "gloo")
if SUITE_BACKEND not in BACKENDS:
    raise SystemExit(f"TORCH_SUITE_BACKEND must be one of {BACKENDS}, not {SUITE_BACKEND!r}")
os.environ.setdefault("WORLD_SIZE", "3")
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "180")
# Select the tests as for gloo (see the module docstring).
os.environ["BACKEND"] = "gloo"
if SUITE_BACKEND == "nexar":
    # nexar tunes its waiting for more local ranks than cores when it knows the count.
    os.environ.setdefault("NEXAR_LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    raise SystemExit("torch.distributed is not available in this torch")

# TestDistBackend._run (every child, before the test) calls
# _set_ddp_with_replicated_tensor(True), which makes each DDP wrap its module in
# ReplicatedTensor (_replicated_tensor_ddp_interop). That imports torch.distributed._shard,
# whose dataclasses Python 3.11 rejects ("mutable default ... TensorProperties ... use
# default_factory"), so every DDP test would fail with Debian's torch 1.13 + Python 3.11.
# The suite is run with that mode off: the setter is replaced by one that always stores
# False, so _run's call becomes a no-op.
import torch.nn.parallel._replicated_tensor_ddp_utils as _rt_utils  # noqa: E402


def _keep_replicated_tensor_off(value):  # noqa: ARG001 - the value is ignored on purpose
    _rt_utils._DDP_WITH_REPLICATED_TENSOR = False


_rt_utils._set_ddp_with_replicated_tensor = _keep_replicated_tensor_off

import torch.testing._internal.common_distributed as common_distributed  # noqa: E402
import torch.testing._internal.distributed.distributed_test as distributed_test  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

# common_distributed sets the root logger to INFO: a few lines per process per test. Keep
# warnings and errors (a failing child logs its traceback at ERROR) unless --verbose.
if not os.environ.get("TORCH_SUITE_VERBOSE"):
    import logging  # noqa: E402

    logging.getLogger().setLevel(logging.WARNING)

# The per-test limit of MultiProcessTestCase._join_processes (it kills the processes and
# fails the test when it runs out); torch's own overrides (test_ddp_uneven_inputs: 400 s)
# stay.
common_distributed.TIMEOUT_DEFAULT = int(os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"])

if SUITE_BACKEND == "nexar":
    import nexar.torch  # noqa: E402,F401  registers the "nexar" backend with torch

    # Everything that captured the backend name at import time.
    distributed_test.BACKEND = "nexar"
    DistTestCases.backend_feature["plugin"].add("nexar")


# The name is torch's (test_distributed_spawn.py); --start decides how the processes start.
class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if os.environ.get("TORCH_SUITE_START", "fork") == "fork":
            # torch 1.13 dropped MultiProcessTestCase._fork_processes; this is what it did.
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


if SUITE_BACKEND == "nexar" and not os.environ.get("TORCH_SUITE_NO_NEXAR_SKIPS"):
    for _name, _reason in NEXAR_SKIPS.items():
        _fn = getattr(TestDistBackendWithSpawn, _name, None)
        if _fn is not None:
            setattr(TestDistBackendWithSpawn, _name, unittest.skip("nexar: " + _reason)(_fn))


# ------------------------------------ the parent only ------------------------------------

class _Result(unittest.TestResult):
    """Records one outcome per test and prints a line per test as it ends."""

    def __init__(self, total):
        super().__init__()
        self.total = total
        self.count = 0
        self.outcomes = {}  # name -> (outcome, seconds, detail)
        self._started = 0.0

    @staticmethod
    def _name(test):
        return test.id().rsplit(".", 1)[-1]

    def startTest(self, test):
        super().startTest(test)
        self._started = time.monotonic()

    def _record(self, test, outcome, detail=""):
        name = self._name(test)
        if name in self.outcomes and self.outcomes[name][0] != "passed":
            return  # a failure in tearDown after one in the test: keep the first
        secs = time.monotonic() - self._started
        first = name not in self.outcomes
        self.outcomes[name] = (outcome, secs, detail)
        if first:
            self.count += 1
        line = f"[{self.count:>4}/{self.total}] {outcome.upper():<7} {name}  {secs:.1f}s"
        if outcome == "skipped" and detail:
            line += f"  ({detail.splitlines()[0][:100]})"
        if outcome == "failed":
            line += "\n" + _excerpt(detail)
        print(line, flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)


def _excerpt(detail, lines=8):
    """The last lines of a failure: torch puts each child's traceback in its RuntimeError."""
    kept = [ln for ln in detail.rstrip().splitlines() if ln.strip()]
    return "\n".join("      " + ln[:300] for ln in kept[-lines:])


def _read_names(path):
    out = []
    for line in pathlib.Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def _select(cli, all_names):
    wanted = list(cli.names)
    files = list(cli.names_file) + ([str(HERE / "subset.txt")] if cli.subset else [])
    for f in files:
        wanted += _read_names(f)
    known = set(all_names)
    if wanted:
        wanted = [w.rsplit(".", 1)[-1] for w in wanted]
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise SystemExit("unknown test name(s): " + ", ".join(unknown))
        chosen = [n for n in all_names if n in set(wanted)]
    else:
        chosen = list(all_names)
    if cli.patterns:
        def match(name):
            for pat in cli.patterns:
                if any(c in pat for c in "*?["):
                    if fnmatch.fnmatchcase(name, pat if "*" in pat else f"*{pat}*"):
                        return True
                elif pat in name:
                    return True
            return False
        chosen = [n for n in chosen if match(n)]
    return chosen


def main(cli):
    loader = unittest.TestLoader()
    all_names = list(loader.getTestCaseNames(TestDistBackendWithSpawn))
    chosen = _select(cli, all_names)
    if cli.list:
        print("\n".join(chosen))
        return 0
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in chosen)
    print(f"torch {torch.__version__}, backend {SUITE_BACKEND}, world {os.environ['WORLD_SIZE']}, "
          f"{len(chosen)} tests, per-test timeout {common_distributed.TIMEOUT_DEFAULT}s",
          flush=True)
    result = _Result(len(chosen))
    started = time.monotonic()
    interrupted = False
    try:
        suite.run(result)
    except KeyboardInterrupt:
        interrupted = True
        traceback.print_exc()
    wall = time.monotonic() - started

    outcomes = result.outcomes
    passed = sorted(n for n, o in outcomes.items() if o[0] == "passed")
    failed = sorted(n for n, o in outcomes.items() if o[0] == "failed")
    skipped = sorted(n for n, o in outcomes.items() if o[0] == "skipped")
    if cli.pass_file:
        pathlib.Path(cli.pass_file).write_text("".join(n + "\n" for n in passed))
    if cli.results_file:
        with open(cli.results_file, "w") as f:
            for n in chosen:
                if n in outcomes:
                    o, secs, detail = outcomes[n]
                    first = detail.strip().splitlines()[-1][:200] if detail.strip() else ""
                    f.write(f"{n}\t{o}\t{secs:.1f}\t{first}\n")
                else:
                    f.write(f"{n}\tnot-run\t0\t\n")
    if failed:
        print("\nFailed:", flush=True)
        for n in failed:
            print(f"  {n}\n{_excerpt(outcomes[n][2], 4)}")
    not_run = len(chosen) - len(outcomes)
    tail = f", {not_run} not run (interrupted)" if not_run or interrupted else ""
    print(f"\nbackend {SUITE_BACKEND}, world {os.environ['WORLD_SIZE']}, wall {wall:.0f}s")
    print(f"{len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped{tail}", flush=True)
    return 1 if failed or not_run or interrupted else 0


if __name__ == "__main__":
    sys.exit(main(CLI))
