"""The worker processes of a gateway started with --workers, found through /proc."""

from __future__ import annotations

from pathlib import Path


def worker_pids(supervisor: int) -> list[int]:
    """The supervisor's spawned workers (not multiprocessing's resource tracker, also its child)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == supervisor and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return sorted(found)
