"""The one-line reason a dying runtime leaves behind: redacted, on one line, bounded, and where to put it.

The same text is shown in /health, /ready and the log, and written to the termination log, which
Kubernetes copies into the pod's status for anyone who can read pods: secrets must never reach it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from servlane_api.runtime_exit import MAX_TERMINATION_MESSAGE_CHARS
from servlane_core.redaction import REDACTED, redact

__all__ = ["REDACTED", "one_line", "redact", "secret_values", "write_termination_message"]

# Environment variables whose values are credentials (HF_TOKEN, AWS_SECRET_ACCESS_KEY, a source's secret).
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE_KEY", re.IGNORECASE)
# Values too short to be a credential would redact ordinary words.
_MIN_SECRET_CHARS = 8


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """The values of the credential-looking variables in `environ`, longest first."""
    values = {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET_CHARS}
    return sorted(values, key=len, reverse=True)


def one_line(text: str, limit: int = MAX_TERMINATION_MESSAGE_CHARS) -> str:
    """`text` on one line (whitespace runs become one space), cut to `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def write_termination_message(message: str, path: str) -> bool:
    """Write `message` where Kubernetes looks for it; False (and nothing else) when the path is not writable."""
    try:
        Path(path).write_text(one_line(message) + "\n")
    except OSError:
        return False
    return True
