"""A short, stable digest of JSON-shaped data: the same data gives the same 16 hex characters in any process."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def json_digest(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
