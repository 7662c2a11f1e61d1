"""The `helm` fixture: skipped with a reason when no helm binary can be had locally, a failure in CI."""

from __future__ import annotations

import os

import pytest

from tests.support.helmtool import Helm, HelmUnavailable, find_helm


@pytest.fixture(scope="session")
def helm() -> Helm:
    try:
        return Helm(find_helm())
    except HelmUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"helm is required in CI: {exc}")
        pytest.skip(str(exc))
