"""`python -m servlane_runtime [--config FILE]`: serve the model that RuntimeConfig names.

Without --config the configuration is the JSON in $SERVLANE_RUNTIME_CONFIG (what the operator
writes). The server listens at once; the model loads in the background (see /ready). If the model
cannot load, or its engine dies, the process exits with a code from servlane_api.runtime_exit and
leaves the reason in the termination log (see model_host).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from servlane_api.runtime_config import ENV_VAR, RuntimeConfig
from servlane_api.runtime_exit import TERMINATION_LOG_ENV, TERMINATION_LOG_PATH
from servlane_web.logs import setup_logging

if TYPE_CHECKING:
    import uvicorn

    from .model_host import ModelHost

# After a fatal failure, how long in-flight requests may take to end (they are failing fast anyway)
# before the process exits regardless; an ordinary SIGTERM drains without this limit.
FATAL_DRAIN_SECONDS = 10
# uvicorn could not start serving (e.g. the port is taken); it has logged why.
SERVER_FAILED_TO_START = 1


def load_config(path: str | None) -> RuntimeConfig:
    if path is not None:
        return RuntimeConfig.model_validate_json(Path(path).read_text())
    return RuntimeConfig.from_env()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="servlane_runtime", description=__doc__)
    parser.add_argument("--config", help=f"RuntimeConfig JSON file (default: ${ENV_VAR})")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        config = load_config(args.config)
    except (KeyError, OSError, ValidationError) as exc:
        print(f"servlane_runtime: invalid configuration: {exc}", file=sys.stderr)
        return 2

    start_engine_import(config.engine)
    return serve(config, args.log_level.lower())


def start_engine_import(engine: str) -> threading.Thread:
    """The engine's imports (seconds of torch, transformers or vLLM) begin at once, in a thread, beside the
    server's own imports and start and the fetching of the model's files, instead of after them; packages no
    engine here uses are kept out (engines.UNUSED_PACKAGES)."""
    from .engines import import_engine, skip_unused_imports

    skip_unused_imports()
    thread = threading.Thread(target=import_engine, args=(engine,), name="engine-import", daemon=True)
    thread.start()
    return thread


def serve(config: RuntimeConfig, log_level: str) -> int:
    """Run the server until it is stopped (0), or until the model host declares a fatal failure (then the
    process ends with the host's exit code, see `_serve_until_fatal`)."""
    import uvicorn

    from servlane_web.open_files import raise_open_files_limit

    from .app import create_app
    from .metrics_port import bind_listeners
    from .server_options import server_options

    raise_open_files_limit()
    app = create_app(config)
    host: ModelHost = app.state.host
    # The API port and /metrics's own port (metrics_port): sockets of the one server, told apart by the app.
    sockets = bind_listeners(app, config.host, config.port, config.metrics_port)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, **server_options()))

    def stop_for_good() -> None:
        server.config.timeout_graceful_shutdown = FATAL_DRAIN_SECONDS
        server.should_exit = True

    host.on_fatal = stop_for_good
    # What uvicorn.run does, with our coroutine around the server's (and its choice of event loop).
    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(_serve_until_fatal(server, host, sockets))
    return 0 if server.started else SERVER_FAILED_TO_START


async def _serve_until_fatal(server: uvicorn.Server, host: ModelHost, sockets: list[socket.socket]) -> None:
    from .termination import write_termination_message

    await server.serve(sockets=sockets)
    if host.exit_code is None:
        return
    path = os.environ.get(TERMINATION_LOG_ENV, TERMINATION_LOG_PATH)
    write_termination_message(host.reason, path)
    sys.stdout.flush()
    sys.stderr.flush()
    # Not a normal exit: a thread stuck in a hung download or in a dead engine would keep the interpreter
    # waiting for it forever (asyncio's executor and concurrent.futures join their threads at exit).
    os._exit(host.exit_code)


if __name__ == "__main__":
    sys.exit(main())
