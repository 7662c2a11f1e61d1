"""`python -m modelplane_runtime [--config FILE]`: serve the model that RuntimeConfig names.

Without --config the configuration is the JSON in $MODELPLANE_RUNTIME_CONFIG (what the operator
writes). The server listens at once; the model loads in the background (see /ready).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pydantic import ValidationError

from modelplane_api.runtime_config import ENV_VAR, RuntimeConfig


def load_config(path: str | None) -> RuntimeConfig:
    if path is not None:
        return RuntimeConfig.model_validate_json(Path(path).read_text())
    return RuntimeConfig.from_env()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="modelplane_runtime", description=__doc__)
    parser.add_argument("--config", help=f"RuntimeConfig JSON file (default: ${ENV_VAR})")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except (KeyError, OSError, ValidationError) as exc:
        print(f"modelplane_runtime: invalid configuration: {exc}", file=sys.stderr)
        return 2

    import uvicorn

    from .app import create_app

    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level=args.log_level.lower())
    return 0


if __name__ == "__main__":
    sys.exit(main())
