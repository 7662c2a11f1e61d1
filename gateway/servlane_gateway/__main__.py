"""`python -m servlane_gateway --routes-file routes.yaml` or `--watch` in a cluster; see --help."""

from __future__ import annotations

import sys

from pydantic import ValidationError

from servlane_gateway.flags import parse_settings
from servlane_gateway.workers import serve
from servlane_web.logs import setup_logging


def main(argv: list[str] | None = None) -> None:
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors())
        sys.exit(f"servlane_gateway: {problems}")
    setup_logging(settings.log_level)
    serve(settings)


if __name__ == "__main__":
    main()
