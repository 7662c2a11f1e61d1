"""Pure manifest builders: typed AIModel in, plain dicts out. No I/O, no globals."""

from modelplane_operator.builders.children import ChildPlan, plan_children
from modelplane_operator.builders.deployment import build_deployment, build_runtime_config
from modelplane_operator.builders.hpa import build_hpa
from modelplane_operator.builders.service import build_service, endpoint_url

__all__ = [
    "ChildPlan",
    "build_deployment",
    "build_hpa",
    "build_runtime_config",
    "build_service",
    "endpoint_url",
    "plan_children",
]
