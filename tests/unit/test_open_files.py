"""raise_open_files_limit: the soft limit on open files goes up to the hard one, and never past it or down.
Run in a child process each, since it changes the process's own limit."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

PROBE = (
    "import logging, resource; logging.basicConfig(level='INFO');"
    "from servlane_web.open_files import raise_open_files_limit;"
    "print(raise_open_files_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))"
)


def probe(soft: int, hard: int) -> tuple[list[int], str]:
    """What the call returns in a process started with these limits, the limits after it, and its log."""

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    done = subprocess.run(
        [sys.executable, "-c", PROBE], preexec_fn=limits, capture_output=True, text=True, timeout=60, check=True
    )
    return [int(v) for v in done.stdout.split()], done.stderr


@pytest.fixture
def hard() -> int:
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if limit == resource.RLIM_INFINITY or limit < 512:
        pytest.fail(f"this machine's hard limit on open files is {limit}: the test needs a finite one of 512 or more")
    return limit


def test_a_low_soft_limit_is_raised_to_the_hard_one(hard: int) -> None:
    values, log = probe(256, hard)
    assert values == [hard, hard, hard]
    assert f"raised from 256 to {hard}" in log


def test_a_soft_limit_at_the_hard_one_is_left_alone(hard: int) -> None:
    values, log = probe(300, 300)
    assert values == [300, 300, 300]
    assert "raised" not in log
