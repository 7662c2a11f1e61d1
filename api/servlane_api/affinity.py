"""A pod's affinity (core/v1 Affinity), typed as the pod API checks it.

It was a free-form object passed to the pods as given: a typo (`nodeAfinity`) did nothing, and a mistake the pod
API refuses (an operator `Bogus`, `In` without values, a weight of 0) was found only when the Deployment was
applied, reported as ChildRejected. Now the AIModel is refused, naming the field. The bounds on list sizes are
ours (the pod API has none), wide for a real affinity and small enough for the CEL rules' cost budget.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from servlane_api._base import ApiModel
from servlane_api.cel import CelRule, CelValidated
from servlane_api.kube_labels import DNS_LABEL_1123, LABEL_KEY, LABEL_KEY_MAX, LABEL_VALUE, label_keys_rule

MAX_TERMS = 16  # terms, expressions, weighted terms, keys per list
MAX_VALUES = 64

LabelKey = Annotated[str, Field(pattern=LABEL_KEY, max_length=LABEL_KEY_MAX)]
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE, max_length=63)]
Weight = Annotated[int, Field(ge=1, le=100, description="1 to 100, added to a node's score where the term holds.")]


def _values_rules(what: str, operators: str) -> tuple[CelRule[LabelSelectorRequirement | NodeSelectorRequirement], ...]:
    """The pod API's rules on a requirement's values: In and NotIn need some, Exists and DoesNotExist take none."""
    return (
        CelRule(
            "!(self.operator in ['In', 'NotIn']) || (has(self.values) && self.values.size() > 0)",
            f"{what} with operator In or NotIn needs at least one value (operators: {operators})",
            lambda r: r.operator not in ("In", "NotIn") or bool(r.values),
        ),
        CelRule(
            "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || self.values.size() == 0",
            f"{what} with operator Exists or DoesNotExist takes no values",
            lambda r: r.operator not in ("Exists", "DoesNotExist") or not r.values,
        ),
    )


class LabelSelectorRequirement(CelValidated):
    cel_rules = (
        *_values_rules("a label selector's requirement", "In, NotIn, Exists, DoesNotExist"),
        label_keys_rule("[self.key]", "a label selector's key must be a label key", lambda r: [r.key]),
    )

    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[LabelValue] | None = Field(default=None, max_length=MAX_VALUES)


class LabelSelector(CelValidated):
    """A label query (meta/v1 LabelSelector): every matchLabels pair and every expression must hold."""

    cel_rules = (
        label_keys_rule(
            "self.matchLabels",
            "matchLabels keys must be label keys",
            lambda s: s.match_labels or {},
            unless_unset="matchLabels",
        ),
    )

    match_labels: dict[str, LabelValue] | None = Field(default=None, max_length=32)
    match_expressions: list[LabelSelectorRequirement] | None = Field(default=None, max_length=MAX_TERMS)


class NodeSelectorRequirement(CelValidated):
    cel_rules = (
        *_values_rules("a node selector's requirement", "In, NotIn, Exists, DoesNotExist, Gt, Lt"),
        CelRule(
            "!(self.operator in ['Gt', 'Lt']) || "
            "(has(self.values) && self.values.size() == 1 && self.values[0].matches('^-?[0-9]{1,18}$'))",
            "a node selector's requirement with operator Gt or Lt takes exactly one value, an integer",
            lambda r: r.operator not in ("Gt", "Lt") or _one_integer(r.values),
        ),
        label_keys_rule("[self.key]", "a node selector's key must be a label key", lambda r: [r.key]),
    )

    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[Annotated[str, Field(max_length=253)]] | None = Field(default=None, max_length=MAX_VALUES)


def _one_integer(values: list[str] | None) -> bool:
    return values is not None and len(values) == 1 and re.fullmatch(r"-?[0-9]{1,18}", values[0]) is not None


class NodeFieldRequirement(ApiModel):
    """A requirement on a node's field: the pod API knows only metadata.name, In or NotIn one name."""

    key: Literal["metadata.name"]
    operator: Literal["In", "NotIn"]
    values: list[Annotated[str, Field(max_length=253)]] = Field(min_length=1, max_length=1)


class NodeSelectorTerm(ApiModel):
    """A node matches the term when all its requirements hold."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(default=None, max_length=MAX_TERMS)
    match_fields: list[NodeFieldRequirement] | None = Field(default=None, max_length=MAX_TERMS)


class NodeSelector(ApiModel):
    """A node matches when any of its terms does."""

    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, max_length=MAX_TERMS)


class PreferredSchedulingTerm(ApiModel):
    weight: Weight
    preference: NodeSelectorTerm


class NodeAffinity(ApiModel):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = Field(
        default=None, max_length=MAX_TERMS
    )


class PodAffinityTerm(CelValidated):
    """Pods (labelSelector, in `namespaces` or those namespaceSelector picks; else the AIModel's own) on nodes
    that share the node label `topologyKey`."""

    cel_rules = (
        label_keys_rule("[self.topologyKey]", "topologyKey must be a label key", lambda t: [t.topology_key]),
        label_keys_rule(
            "self.matchLabelKeys",
            "each of matchLabelKeys must be a label key",
            lambda t: t.match_label_keys or [],
            unless_unset="matchLabelKeys",
        ),
        label_keys_rule(
            "self.mismatchLabelKeys",
            "each of mismatchLabelKeys must be a label key",
            lambda t: t.mismatch_label_keys or [],
            unless_unset="mismatchLabelKeys",
        ),
        CelRule(
            "has(self.labelSelector) || ((!has(self.matchLabelKeys) || self.matchLabelKeys.size() == 0) && "
            "(!has(self.mismatchLabelKeys) || self.mismatchLabelKeys.size() == 0))",
            "matchLabelKeys and mismatchLabelKeys need a labelSelector",
            lambda t: t.label_selector is not None or not (t.match_label_keys or t.mismatch_label_keys),
        ),
    )

    label_selector: LabelSelector | None = None
    namespaces: list[Annotated[str, Field(pattern=DNS_LABEL_1123, max_length=63)]] | None = Field(
        default=None, max_length=32
    )
    namespace_selector: LabelSelector | None = None
    topology_key: LabelKey
    match_label_keys: list[Annotated[str, Field(max_length=LABEL_KEY_MAX)]] | None = Field(
        default=None, max_length=MAX_TERMS
    )
    mismatch_label_keys: list[Annotated[str, Field(max_length=LABEL_KEY_MAX)]] | None = Field(
        default=None, max_length=MAX_TERMS
    )


class WeightedPodAffinityTerm(ApiModel):
    weight: Weight
    pod_affinity_term: PodAffinityTerm


class PodAffinity(ApiModel):
    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        default=None, max_length=MAX_TERMS
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(
        default=None, max_length=MAX_TERMS
    )


class PodAntiAffinity(PodAffinity):
    """The same terms as PodAffinity, read the other way: nodes to avoid."""


class Affinity(ApiModel):
    """A core/v1 Affinity, passed to the pods as written."""

    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAntiAffinity | None = None
