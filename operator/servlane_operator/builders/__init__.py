"""Pure manifest builders: typed AIModel in, plain dicts out. No I/O, no globals."""

from servlane_operator.builders.children import ChildPlan, plan_children
from servlane_operator.builders.deployment import build_deployment, runtime_image
from servlane_operator.builders.network_policy import build_network_policy
from servlane_operator.builders.replicas_handover import replicas_handover
from servlane_operator.builders.service import build_service, endpoint_url

__all__ = [
    "ChildPlan",
    "build_deployment",
    "build_network_policy",
    "build_service",
    "endpoint_url",
    "plan_children",
    "replicas_handover",
    "runtime_image",
]
