"""The documentation site builds in strict mode, its reference pages cover every field of the API models, and
the README stays a short front page with the two commands the Makefile provides."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from servlane_api.aifeature import AIFeatureSpec
from servlane_api.aimodel import AIModelSpec
from servlane_api.cel import models_in

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    return out


def field_paths(model: type[BaseModel], prefix: str) -> list[str]:
    """Every field of `model` and of the models nested in it, as the reference names it (camelCase)."""
    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}.{field.alias or name}"
        paths.append(path)
        for nested in models_in(field.annotation):
            paths.extend(field_paths(nested, path + _container_suffix(field.annotation)))
    return paths


def _container_suffix(annotation: object) -> str:
    text = str(annotation)
    return "[]" if text.startswith("list[") else "{}" if text.startswith("dict[") else ""


@pytest.mark.parametrize(("model", "page"), [(AIModelSpec, "aimodel"), (AIFeatureSpec, "aifeature")])
def test_reference_lists_every_field(site: Path, model: type[BaseModel], page: str) -> None:
    html = (site / "reference" / page / "index.html").read_text()
    listed = set(re.findall(r"<code>(spec\.[^<]+)</code>", html))
    missing = [path for path in field_paths(model, "spec") if path not in listed]
    assert not missing, f"fields missing from the {page} reference: {missing}"


def test_readme_is_a_front_page_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run", "test"):
        assert re.search(rf"^make {target}\s+# ", readme, re.M), f"`make {target}` is not in the README"
        assert re.search(rf"^{target}:", makefile, re.M), f"the README's `make {target}` has no Makefile target"
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), f"the README links to {link}, which does not exist"
