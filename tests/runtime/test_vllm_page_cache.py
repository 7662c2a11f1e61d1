"""vLLM's CPU worker counts its pod's page cache as the free memory it is (servlane_runtime.engines.
vllm_cpu_worker), so a fresh pod whose cgroup has just read torch's libraries still gets the KV cache the runtime
sized for it. Found on the real node (e2e/test_real_pods_vllm.py): a 4 GiB pod of the tiny model at the shipped
defaults failed its first start with vLLM's "Available memory on node 0 (0.61/4.0 GiB) on kv cache allocation
is less than requested memory for kv (1.0 GiB)", and served after a restart.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from servlane_runtime.engines import cpu_memory
from servlane_runtime.engines.cpu_memory import GIB, page_cache_bytes, usage_less_page_cache
from tests.support.vllm import require_vllm

# What the first start's cgroup held when vLLM checked (the numbers of the failure above): 3.39 GiB charged,
# 1.4 GiB of it page cache (file pages), so 2 GiB of processes.
LIMIT = 4 * GIB
FILE_PAGES = int(1.4 * GIB)
CURRENT = int(3.39 * GIB)
STAT_V2 = (
    f"anon {CURRENT - FILE_PAGES}\nfile {FILE_PAGES}\nshmem 1048576\nactive_anon 1000\ninactive_anon 2000\n"
    f"active_file {FILE_PAGES // 4}\ninactive_file {FILE_PAGES - FILE_PAGES // 4}\nunevictable 0\n"
)


def test_page_cache_is_the_file_pages_of_memory_stat() -> None:
    assert page_cache_bytes(STAT_V2) == FILE_PAGES  # not `file` (it holds shmem), not the anon lists
    # cgroup v1: the hierarchical counts, as its usage_in_bytes is hierarchical.
    v1 = "active_file 1\ninactive_file 2\ntotal_active_file 10\ntotal_inactive_file 20\n"
    assert page_cache_bytes(v1) == 30
    assert page_cache_bytes("") == 0
    assert page_cache_bytes("active_file x\n") == 0


def test_usage_less_page_cache() -> None:
    assert usage_less_page_cache(CURRENT, STAT_V2) == CURRENT - FILE_PAGES
    assert usage_less_page_cache(None, STAT_V2) is None  # no cgroup usage: nothing to correct
    assert usage_less_page_cache(CURRENT, None) == CURRENT
    assert usage_less_page_cache(10, "active_file 50\n") == 0


def test_vllms_kv_cache_check_counts_the_page_cache_as_available(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vLLM's own get_memory_node_info (its KV cache check's numbers) in a cgroup like the failed pod's, before
    and after its worker imported our extension module."""
    require_vllm()
    from vllm.utils import cpu_resource_utils

    cgroup = {"/sys/fs/cgroup/memory.max": LIMIT, "/sys/fs/cgroup/memory.current": CURRENT}
    monkeypatch.setattr(cpu_resource_utils, "_read_int_file", cgroup.get)
    stat = tmp_path / "memory.stat"
    stat.write_text(STAT_V2)
    monkeypatch.setattr(cpu_memory, "CGROUP_V2_STAT", str(stat))
    # Restored after the test: the import below replaces it in this process.
    monkeypatch.setattr(cpu_resource_utils, "get_cgroup_memory_usage", cpu_resource_utils.get_cgroup_memory_usage)

    node = cpu_resource_utils.get_allowed_cpu_list()[0].numa_node
    seen_by_vllm = cpu_resource_utils.get_memory_node_info(node).available_memory
    assert seen_by_vllm < 1 * GIB  # vLLM alone: the page cache is used memory, 1 GiB of KV cache is refused

    from servlane_runtime.engines import vllm_cpu_worker

    importlib.reload(vllm_cpu_worker)  # as in vLLM's fresh worker process, whatever this process imported before
    info = cpu_resource_utils.get_memory_node_info(node)
    assert info.total_memory == LIMIT
    assert info.available_memory == LIMIT - (CURRENT - FILE_PAGES)  # ~2 GiB: the 1 GiB cache fits
    importlib.reload(vllm_cpu_worker)
    assert cpu_resource_utils.get_memory_node_info(node).available_memory == info.available_memory  # wrapped once
