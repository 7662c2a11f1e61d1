"""source.s3 (servlane_api.s3_source): what the API accepts for an S3-compatible store, and what reaches the
runtime. The CRD's `pattern`s run on the API server's Go regexp (RE2): they must agree with Python's re."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from servlane_api.aimodel import AIModel, ModelSource
from servlane_api.runtime_contract import build_runtime_config
from servlane_api.s3_source import S3_ENDPOINT, S3_REGION, S3Options, S3Settings

GOOD_ENDPOINTS = (
    "http://seaweedfs.storage:8333",
    "https://s3.eu-central-1.amazonaws.com",
    "http://127.0.0.1:9000",
    "https://[fd00::1]:8443",
    "http://minio",
    "https://r2.example-1.com",
)
BAD_ENDPOINTS = (
    "seaweedfs:8333",  # no scheme
    "ftp://store:21",
    "http://key:secret@store:9000",  # credentials belong in the Secret
    "http://store:9000/bucket",  # no path
    "http://store:9000/",
    "http://store?x=1",
    "http://store#x",
    "http://-store",
    "http://store-",
    "http://sto re",
    "http://store:123456",
    "http://store\n",
    "http://",
    "",
)
GOOD_REGIONS = ("us-east-1", "eu-central-2", "garage", "a", "ap-southeast-5")
BAD_REGIONS = ("US-EAST-1", "-us", "us-", "us east", "us/east", "", "a" * 65, "us-east-1\n")


@pytest.mark.parametrize("endpoint", GOOD_ENDPOINTS)
def test_an_endpoint_is_a_scheme_a_host_and_a_port(endpoint: str) -> None:
    assert S3Options(endpoint=endpoint).endpoint == endpoint
    assert S3Settings(endpoint=endpoint).endpoint == endpoint


@pytest.mark.parametrize("endpoint", BAD_ENDPOINTS)
def test_an_endpoint_with_anything_else_is_refused(endpoint: str) -> None:
    with pytest.raises(ValidationError):
        S3Options(endpoint=endpoint)
    with pytest.raises(ValidationError):
        S3Settings(endpoint=endpoint)


@pytest.mark.parametrize("region", GOOD_REGIONS)
def test_good_regions(region: str) -> None:
    assert S3Options(region=region).region == region


@pytest.mark.parametrize("region", BAD_REGIONS)
def test_bad_regions(region: str) -> None:
    with pytest.raises(ValidationError):
        S3Options(region=region)


@pytest.mark.parametrize("seconds", [0, -1, 3601])
def test_the_stall_timeout_is_bounded(seconds: int) -> None:
    with pytest.raises(ValidationError):
        S3Options(stallTimeoutSeconds=seconds)


def test_the_defaults_are_aws_and_a_minute_of_stall() -> None:
    options = S3Options()
    assert (options.endpoint, options.region, options.path_style, options.stall_timeout_seconds) == (
        None,
        None,
        None,
        60,
    )
    assert options.settings() == S3Settings()


def test_source_s3_applies_to_s3_sources_only() -> None:
    ModelSource.model_validate({"uri": "s3://models/qwen", "s3": {"endpoint": "http://store:8333"}})
    for uri in ("hf://org/name", "pvc://weights/m", "/models/m"):
        with pytest.raises(ValidationError, match=re.escape("source.s3 applies only to s3:// sources")):
            ModelSource.model_validate({"uri": uri, "s3": {"endpoint": "http://store:8333"}})


def _model(source: dict[str, Any]) -> AIModel:
    return AIModel.model_validate(
        {"metadata": {"name": "m", "namespace": "team-a"}, "spec": {"source": source, "engine": "transformers"}}
    )


def test_the_runtime_gets_the_sources_store_settings_and_no_credentials() -> None:
    source = {
        "uri": "s3://models/qwen",
        "credentialsSecret": "store-keys",
        "s3": {"endpoint": "http://seaweedfs.storage:8333", "region": "us-east-1", "pathStyle": True},
    }
    config = build_runtime_config(_model(source))
    assert config.model_source == "s3://models/qwen"
    assert config.s3 == S3Settings(
        endpoint="http://seaweedfs.storage:8333", region="us-east-1", path_style=True, stall_timeout_seconds=60
    )
    assert "store-keys" not in config.to_env_value()  # the Secret reaches the pod through envFrom only
    assert build_runtime_config(_model({"uri": "s3://models/qwen"})).s3 == S3Settings()


def samples() -> list[str]:
    return [
        *GOOD_ENDPOINTS,
        *BAD_ENDPOINTS,
        *GOOD_REGIONS,
        *BAD_REGIONS,
        "http://[::1]",
        "https://[zz::1]:1",
        "http://a.b.c.d.e.f:1",
        "http://a..b",
        "https://é.example",
        "us-east-1\r",
        "us_east_1",
        "_us",
    ]


@pytest.mark.skipif(shutil.which("go") is None, reason="needs Go for its RE2 regexp")
def test_go_regexp_and_python_re_agree_on_the_store_patterns(tmp_path: Path) -> None:
    inputs = samples()
    patterns = [S3_ENDPOINT, S3_REGION]
    program = Path(__file__).with_name("re2_match") / "main.go"
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "GO111MODULE": "off"}
    done = subprocess.run(
        ["go", "run", str(program)],
        input=json.dumps({"patterns": patterns, "inputs": inputs}),
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    for pattern, results in zip(patterns, json.loads(done.stdout), strict=True):
        python = [re.fullmatch(pattern, text) is not None for text in inputs]
        assert python == results, [text for text, a, b in zip(inputs, python, results, strict=True) if a != b]
