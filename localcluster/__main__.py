"""`python -m localcluster build|up|down [--dir DIR] [--real-node [--kube-proxy]]`: the local control plane from
the command line; `--real-node` adds one real worker node (root, runc, CNI plugins; see realnode.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from localcluster.cluster import LocalCluster, binary_paths, build_binaries


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__)
    parser.add_argument("command", choices=["build", "up", "down"])
    parser.add_argument("--dir", type=Path, default=Path(".artifacts/cluster"), help="work folder (logs, PKI, state)")
    parser.add_argument("--real-node", action="store_true", help="up: add a real node (kubelet, containerd, CNI)")
    parser.add_argument("--kube-proxy", action="store_true", help="up --real-node: run kube-proxy (iptables) too")
    args = parser.parse_args()
    cluster = LocalCluster(args.dir.resolve(), real_node=args.real_node, real_node_kube_proxy=args.kube_proxy)
    if args.command == "build":
        print(build_binaries())
        if args.real_node:
            from localcluster.realnode import build_node_binaries

            print(build_node_binaries())
    elif args.command == "up":
        cluster.bins = binary_paths()
        cluster.up()
        print(f"export KUBECONFIG={cluster.kubeconfig}")
    else:
        cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
