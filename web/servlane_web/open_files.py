"""A server's limit on open files raised to what the container allows.

Every connection a server holds is a file descriptor: a client's, and for the gateway the upstream one beside
it. Containers often start with a soft limit of 1024 (containerd 2 under systemd 240 and later passes on
systemd's default, soft 1024 against a hard limit of 524288), which Python keeps as it finds it. A gateway
process would then refuse connections past about a thousand (accept fails with EMFILE and the connection is
reset), so a few hundred streams, or one tenant holding a thousand idle connections, would lock every other
tenant out. The soft limit is the process's to raise up to the hard one, as Go's runtime does for every Go
program and nginx's `worker_rlimit_nofile` does: the hard limit stays the deployer's ceiling, and the event
loops here use epoll, not select(), so descriptors above 1024 are fine. Child processes (the gateway's
workers) inherit the raised limit.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)


def raise_open_files_limit() -> int:
    """Raises this process's soft RLIMIT_NOFILE to its hard limit; returns the soft limit in force after. A
    failure (a platform without it) is logged and leaves the limit as it was."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
            return soft
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:
        log.warning("the open files limit stays as it was: %s", exc)
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    log.info("open files limit raised from %d to %d (the hard limit)", soft, hard)
    return hard
