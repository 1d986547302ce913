"""Minimal stand-in for the PyPI package ``expecttest`` (not installable here).

torch.testing._internal.common_utils imports it for two things only: the module flag
``ACCEPT`` and the base class ``TestCase``. The distributed suite never compares against
inline expectations, so the assertions below are plain comparisons: they never rewrite
source files. run_suite.py puts this directory on sys.path; nothing installs it.
"""

import os
import unittest

ACCEPT = os.getenv("EXPECTTEST_ACCEPT", "") not in ("", "0")


def _normalize(text):
    # What expecttest compares: the literal after textwrap-style dedent and strip.
    lines = text.strip("\n").splitlines()
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    cut = min(indents) if indents else 0
    return "\n".join(line[cut:] for line in lines).rstrip()


class TestCase(unittest.TestCase):
    longMessage = True

    def assertExpectedInline(self, actual, expect, skip=0):
        if ACCEPT:
            return
        self.assertMultiLineEqual(_normalize(expect), _normalize(str(actual)))

    def assertExpectedRaisesInline(self, exc_type, callable, expect, *args, **kwargs):
        try:
            callable(*args, **kwargs)
        except exc_type as e:
            self.assertExpectedInline(str(e), expect, skip=1)
            return
        self.fail(msg="Did not raise when expected to")

