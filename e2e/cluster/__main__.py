"""`python -m e2e.cluster build|up|down [--dir DIR]`: the local control plane from the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from e2e.cluster.localcluster import LocalCluster, binary_paths, build_binaries


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__)
    parser.add_argument("command", choices=["build", "up", "down"])
    parser.add_argument("--dir", type=Path, default=Path(".artifacts/cluster"), help="work folder (logs, PKI, state)")
    args = parser.parse_args()
    cluster = LocalCluster(args.dir.resolve())
    if args.command == "build":
        print(build_binaries())
    elif args.command == "up":
        cluster.bins = binary_paths()
        cluster.up()
        print(f"export KUBECONFIG={cluster.kubeconfig}")
    else:
        cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
