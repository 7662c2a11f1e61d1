"""How a runtime process ends when it cannot serve: its exit codes and its termination message.

Part of the operator/runtime contract (next to `runtime_config`): the runtime exits with one of these
codes and writes a one-line reason to TERMINATION_LOG_PATH (Kubernetes' default terminationMessagePath);
the kubelet restarts it and the operator reads both back from the pod's container status to say, in the
AIModel's conditions, why the model is not serving.
"""

from __future__ import annotations

# The model could not be loaded (files missing, bad configuration, load timeout): restarting the same
# pod will most likely fail the same way, so the AIModel says ModelLoadFailed.
MODEL_LOAD_FAILED = 10
# The engine died while serving (vLLM's engine core process is gone, the GPU failed): a restart may help.
ENGINE_DIED = 11
# The model's files could not be had from its source (wrong credentials, a missing bucket, key or image, a
# stalled transfer): the message starts with the store's own words, and the AIModel says ModelSourceFailed.
MODEL_SOURCE_FAILED = 12

TERMINATION_LOG_PATH = "/dev/termination-log"
# Overrides TERMINATION_LOG_PATH (tests; a pod with another terminationMessagePath).
TERMINATION_LOG_ENV = "SERVLANE_TERMINATION_LOG"
# Kubernetes keeps at most 4096 bytes of a termination message; one readable line is plenty.
MAX_TERMINATION_MESSAGE_CHARS = 1024
