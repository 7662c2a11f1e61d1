"""The `servlane` command: serve AIModel/AIFeature manifests on this machine, without Kubernetes.

servlane serve [-f PATH ...]     runtimes + gateway + canary controller (default: examples/local)
servlane status [-f PATH ...]    models, features and the last canary analysis
servlane chat FEATURE            a streaming chat client for the local gateway
servlane init-tiny-model DIR     the tiny CPU chat model the local example uses
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from servlane_cli.ports import port_number
from servlane_cli.state import default_state_dir, read_state
from servlane_web.logs import quiet_http_clients

_REPO_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local"


def default_inputs() -> list[Path]:
    """examples/local of the source checkout (editable install), else ./examples/local."""
    return [_REPO_EXAMPLE if _REPO_EXAMPLE.is_dir() else Path("examples/local")]


def _state_dir(args: argparse.Namespace) -> Path:
    if args.state_dir is not None:
        return Path(args.state_dir)
    return default_state_dir(_inputs(args))


def _inputs(args: argparse.Namespace) -> list[Path]:
    return [Path(p).resolve() for p in args.file] if args.file else default_inputs()


def _add_location(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--file", action="append", metavar="PATH", help="manifest file or folder (repeatable; default: example)"
    )
    parser.add_argument("--state-dir", help="where state, routes and logs live (default: derived from -f)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servlane", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve manifests on this machine until Ctrl-C")
    _add_location(serve)
    serve.add_argument("--host", default="127.0.0.1", help="the gateway's listen address (default 127.0.0.1)")
    serve.add_argument(
        "--port", type=port_number, default=8080, help="the gateway's port (0: any free port; default 8080)"
    )
    serve.add_argument("--stop-timeout", type=float, default=10.0, help="seconds a process gets to stop")
    serve.add_argument("--model-cache", help="where hf:// models are downloaded (default ~/.cache/servlane/models)")
    serve.add_argument("-v", "--verbose", action="store_true")
    status = commands.add_parser("status", help="show what `servlane serve` is doing")
    _add_location(status)
    status.add_argument("--json", action="store_true", help="the raw state as JSON")
    chat = commands.add_parser("chat", help="chat with a feature through the local gateway")
    _add_location(chat)
    chat.add_argument("feature", help="an AIFeature name, e.g. chat, or a model's served name")
    chat.add_argument("-m", "--message", help="send one message, print the answer and exit")
    chat.add_argument("--max-tokens", type=int, default=128)
    chat.add_argument("--wait", type=float, default=600, help="seconds to wait for the feature's model to load")
    tiny = commands.add_parser("init-tiny-model", help="create the tiny CPU chat model in DIR")
    tiny.add_argument("dir")
    return parser


def _serve(args: argparse.Namespace) -> int:
    from servlane_cli.supervisor import ServeOptions, serve

    level = logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    quiet_http_clients()  # a line per probe otherwise, and a download's presigned URL
    options = ServeOptions(
        inputs=_inputs(args), state_dir=_state_dir(args), host=args.host, port=args.port, stop_timeout=args.stop_timeout
    )
    if args.model_cache:
        options = ServeOptions(**{**vars(options), "model_cache": Path(args.model_cache)})
    return serve(options)


def _status(args: argparse.Namespace) -> int:
    from servlane_cli.status_cmd import render_status

    state = read_state(_state_dir(args))
    if state is None:
        print(f"servlane: nothing served from {_state_dir(args)} yet; start `servlane serve`", file=sys.stderr)
        return 1
    print(state.model_dump_json(indent=1) if args.json else render_status(state))
    return 0


def _chat(args: argparse.Namespace) -> int:
    from servlane_cli.chat_cmd import chat, wait_until_served

    state_dir = _state_dir(args)
    problem = wait_until_served(lambda: read_state(state_dir), args.feature, args.wait)
    state = read_state(state_dir)
    if problem is not None or state is None:
        print(f"servlane: {problem}", file=sys.stderr)
        return 1
    return chat(state.gateway.url + "/v1", args.feature, args.message, args.max_tokens)


def _init_tiny_model(args: argparse.Namespace) -> int:
    try:
        from servlane_devtools.tiny_model import create_tiny_model
    except ImportError:
        # Developer tooling ships with the source tree, not the product's wheel (see devtools/).
        print("servlane: init-tiny-model needs servlane-devtools: pip install -e devtools/", file=sys.stderr)
        return 1
    print(create_tiny_model(Path(args.dir).expanduser().resolve()))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"serve": _serve, "status": _status, "chat": _chat, "init-tiny-model": _init_tiny_model}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
