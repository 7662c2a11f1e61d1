"""The environment variables the operator sets on every model pod itself, listed once.

The Deployment builder writes exactly these, and AIModel admission refuses a `spec.env` that names one of
them: a second entry with the same name would make server-side apply of the Deployment fail (the pod's
env is a list keyed by name), and silently replacing ours would break the runtime.
"""

from __future__ import annotations

from servlane_api.runtime_config import ENV_VAR, MODEL_CACHE_DIR

# The root filesystem is read-only: Hugging Face's cache lives on the model cache volume and HOME on the
# writable /tmp (libraries write dot-files there).
FIXED_POD_ENV: dict[str, str] = {"HF_HOME": f"{MODEL_CACHE_DIR}/hf", "HOME": "/tmp"}

# ENV_VAR carries the runtime's configuration, computed per model.
RESERVED_ENV_NAMES: tuple[str, ...] = (ENV_VAR, *FIXED_POD_ENV)
