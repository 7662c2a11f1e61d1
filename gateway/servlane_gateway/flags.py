"""The gateway's settings: each one from a CLI flag, else an environment variable, else its default.

Environment variables are the flag names upper-cased with SERVLANE_GATEWAY_ in front, e.g.
--routes-file ↔ SERVLANE_GATEWAY_ROUTES_FILE, --namespaces ↔ SERVLANE_GATEWAY_NAMESPACES (comma-separated,
like SERVLANE_GATEWAY_SERVING_NAMESPACES).
`--endpoint-override FROM=TO` repeats; its variable SERVLANE_GATEWAY_ENDPOINT_OVERRIDES holds a comma list of
FROM=TO or a JSON object.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from servlane_gateway.settings import GatewaySettings

ENV_PREFIX = "SERVLANE_GATEWAY_"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_settings(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> GatewaySettings:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="python -m servlane_gateway", description=__doc__)
    for name, info in GatewaySettings.model_fields.items():
        if name == "watch":
            parser.add_argument(_flag(name), action="store_true", default=None, help=info.description)
        elif name == "endpoint_overrides":
            parser.add_argument("--endpoint-override", dest=name, action="append", default=None, help=info.description)
        else:
            parser.add_argument(_flag(name), default=None, help=info.description or f"default: {info.default}")
    args = vars(parser.parse_args(argv))
    values: dict[str, object] = {}
    for name in GatewaySettings.model_fields:
        value = args.get(name)
        if value is None:
            value = env.get(ENV_PREFIX + name.upper())
        if value is None:
            continue
        if name in ("namespaces", "serving_namespaces") and isinstance(value, str):
            value = [ns.strip() for ns in value.split(",") if ns.strip()]
        values[name] = value
    return GatewaySettings.model_validate(values)
