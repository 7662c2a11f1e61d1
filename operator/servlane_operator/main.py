"""`servlane-operator`: runs the kopf operator with Servlane's handlers.

Settings come from the environment (see settings.py); flags here cover how kopf runs. The operator's
context (context.py) is made here, once, and handed to kopf as its memo.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

import kopf
from kopf._core.engines.peering import Identity  # kopf.run's identity type, not re-exported
from kubernetes.config import ConfigException

import servlane_operator.handlers  # noqa: F401  (registers the handlers with kopf)
from servlane_operator.context import OperatorContext
from servlane_operator.settings import OperatorSettings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="servlane-operator", description=__doc__)
    parser.add_argument(
        "--namespace", "-n", action="append", default=[], help="watch only these namespaces (repeatable); default all"
    )
    parser.add_argument("--peering", default=None, help="kopf peering name; several replicas then share the work")
    parser.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="kopf liveness endpoint URL")
    parser.add_argument(
        "--log-format", choices=["plain", "full", "json"], default=os.environ.get("SERVLANE_LOG_FORMAT", "json")
    )
    parser.add_argument("--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Checked here, before kopf starts, so a bad setting is one clear line and exit code 2, not a traceback.
    try:
        settings = OperatorSettings.from_env()
        if args.namespace:
            settings = settings.model_copy(update={"namespaces": list(args.namespace)})
    except ValueError as exc:
        print(f"servlane-operator: invalid settings: {exc}", file=sys.stderr)
        return 2
    if problem := settings.unscoped_gateway_trust():
        print(f"servlane-operator: invalid settings: {problem}", file=sys.stderr)
        return 2
    namespaces = list(settings.namespaces)
    try:
        context = OperatorContext.create(settings)
    except ConfigException as exc:
        print(f"servlane-operator: no Kubernetes credentials (in-cluster or $KUBECONFIG): {exc}", file=sys.stderr)
        return 2

    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    loop = asyncio.new_event_loop()
    # Kubernetes calls run in threads; many models reconcile at once, so give them room.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=32, thread_name_prefix="kube"))
    kopf.run(
        loop=loop,
        # kopf's own default identity asks getpass for the user name, which raises for a uid with no passwd
        # entry (the chart's 65532, OpenShift's random uids); the pod's host name is unique among peers.
        identity=Identity(f"servlane-operator@{socket.gethostname()}"),
        standalone=args.peering is None,
        peering_name=args.peering,
        liveness_endpoint=args.liveness,
        clusterwide=not namespaces,
        namespaces=namespaces,
        memo=context,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
