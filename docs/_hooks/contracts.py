"""MkDocs hook: the import contracts of `pyproject.toml` ([tool.importlinter]), rendered at every build.

`<!-- servlane-contracts: layers -->` becomes a mermaid picture of the layers contract (top to bottom, the
processes side by side); `<!-- servlane-contracts: table -->` a table of every contract. Both are read from the
file `lint-imports` checks, so the architecture page says what is enforced, not what once was.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
MARKER = re.compile(r"<!--\s*servlane-contracts:\s*(\S+)\s*-->")


def on_page_markdown(markdown: str, **_: Any) -> str:
    return MARKER.sub(lambda match: render(match.group(1)), markdown)


def contracts() -> list[dict[str, Any]]:
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return list(config["contracts"])


def render(what: str) -> str:
    if what == "layers":
        return layers_picture()
    if what == "table":
        return contracts_table()
    raise ValueError(f"servlane-contracts: unknown view {what!r}; known: layers, table")


def layers_picture() -> str:
    layered = [c for c in contracts() if c["type"] == "layers"]
    if len(layered) != 1:
        raise ValueError(f"servlane-contracts: expected one layers contract in {PYPROJECT}, found {len(layered)}")
    rows = [[name.strip() for name in layer.split("|")] for layer in layered[0]["layers"]]
    lines = ["```mermaid", "flowchart TB"]
    for index, row in enumerate(rows):
        lines.append(f'  subgraph L{index}[" "]')
        lines.append("    direction LR")
        lines.extend(f"    {name}" for name in row)
        lines.append("  end")
    lines.extend(f"  L{index} --> L{index + 1}" for index in range(len(rows) - 1))
    lines.append("```")
    return "\n".join(lines)


def contracts_table() -> str:
    rows = ["| contract | kind | modules | may not import |", "| --- | --- | --- | --- |"]
    for contract in contracts():
        kind = contract["type"]
        if kind == "layers":
            modules, forbidden = " > ".join(contract["layers"]), "a layer above its own"
        elif kind == "independence":
            modules, forbidden = ", ".join(contract["modules"]), "one another"
        else:
            modules, forbidden = ", ".join(contract["source_modules"]), ", ".join(contract["forbidden_modules"])
        exceptions = len(contract.get("ignore_imports", []))
        if exceptions:
            forbidden += f" ({exceptions} listed exceptions)"
        rows.append(f"| {_cell(contract['name'])} | {kind} | {_code(modules)} | {_code(forbidden)} |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


NAMES = re.compile(
    r"\b(servlane_\w+(?:\.\w+)*|kopf|kubernetes|httpx|fastapi|starlette|uvicorn|redis|sqlalchemy"
    r"|alembic|prometheus_client|opentelemetry|torch|vllm|transformers)\b"
)


def _code(text: str) -> str:
    return _cell(NAMES.sub(r"`\1`", text))
