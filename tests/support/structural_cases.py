"""One table of manifests with a field the CRD's structural schema lacks or a value of the wrong JSON type, shared
by the unit test of servlane_api.structural (and standalone mode's loader) and the API server one (e2e): both
must refuse each case naming the same field, and accept each good one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.support.cel_cases import Manifest, ai_feature, ai_model, feature_spec, model_spec


@dataclass(frozen=True)
class StructuralCase:
    id: str
    manifest: Manifest
    refused_at: str | None  # the field path both name; None: both accept it
    api_server_says: str | None = None  # where the API server names the field otherwise (ObjectMeta's decoder)


def _with_metadata(manifest: Manifest, **metadata: Any) -> Manifest:
    return {**manifest, "metadata": {**manifest["metadata"], **metadata}}


STRUCTURAL_CASES = (
    # Pydantic alone reads a quoted number or boolean as one; the API server does not.
    StructuralCase("quoted-integer", ai_model(model_spec(replicas="2")), "spec.replicas"),
    StructuralCase(
        "quoted-number", ai_feature(feature_spec(defaults={"temperature": "0.5"})), "spec.defaults.temperature"
    ),
    StructuralCase(
        "quoted-boolean",
        ai_model(model_spec(engineOptions={"enableAdapters": "true"})),
        "spec.engineOptions.enableAdapters",
    ),
    StructuralCase("integer-given-a-fraction", ai_model(model_spec(replicas=1.5)), "spec.replicas"),
    StructuralCase("object-given-a-list", ai_model(model_spec(resources=["gpus", 1])), "spec.resources"),
    StructuralCase("list-given-an-object", ai_model(model_spec(env={"name": "A", "value": "b"})), "spec.env"),
    StructuralCase("string-given-a-number", ai_model(model_spec(source={"uri": 7})), "spec.source.uri"),
    StructuralCase(
        "map-value-not-a-string",
        ai_model(model_spec(scheduling={"nodeSelector": {"gpu": True}})),
        "spec.scheduling.nodeSelector.gpu",
    ),
    StructuralCase(
        "label-value-a-number",
        _with_metadata(ai_model(model_spec()), labels={"tier": 1}),
        "metadata.labels.tier",
        "ObjectMeta.labels",
    ),
    # Ignored by pydantic, refused by `kubectl apply`'s strict field validation: a typo that would do nothing.
    StructuralCase("unknown-spec-field", ai_model(model_spec(replica=2)), "spec.replica"),
    StructuralCase("unknown-nested-field", ai_feature(feature_spec(rollout={"step": [10, 50]})), "spec.rollout.step"),
    StructuralCase(
        "unknown-field-in-a-list-item", ai_model(model_spec(env=[{"name": "A", "valu": "b"}])), "spec.env[0].valu"
    ),
    StructuralCase(
        "unknown-value-from-source",
        ai_model(model_spec(env=[{"name": "A", "valueFrom": {"secretRef": {"name": "s", "key": "k"}}}])),
        "spec.env[0].valueFrom.secretRef",
    ),
    StructuralCase(
        "unknown-affinity-field",
        ai_model(model_spec(scheduling={"affinity": {"nodeAfinity": {}}})),
        "spec.scheduling.affinity.nodeAfinity",
    ),
    StructuralCase(
        "affinity-weight-quoted",
        ai_model(
            model_spec(
                scheduling={
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {"weight": "10", "podAffinityTerm": {"topologyKey": "zone"}}
                            ]
                        }
                    }
                }
            )
        ),
        "spec.scheduling.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
    ),
    StructuralCase("unknown-top-level-field", {**ai_model(model_spec()), "specs": {}}, "specs"),
    StructuralCase(
        "unknown-metadata-field", _with_metadata(ai_model(model_spec()), lables={"a": "b"}), "metadata.lables"
    ),
    # Every object's name is a DNS subdomain, whatever its kind (standalone mode served `default/chat`).
    StructuralCase("name-not-a-subdomain", ai_feature(feature_spec(), name="Chat"), "metadata.name"),
    StructuralCase("name-with-a-slash", ai_feature(feature_spec(), name="default/chat"), "metadata.name"),
    # Accepted by both.
    StructuralCase("integer-for-a-number", ai_feature(feature_spec(defaults={"temperature": 1})), None),
    StructuralCase(
        "free-form-value-from",
        ai_model(model_spec(env=[{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])),
        None,
    ),
    StructuralCase(
        "a-whole-affinity",
        ai_model(
            model_spec(
                scheduling={
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}],
                                        "matchFields": [
                                            {"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}
                                        ],
                                    }
                                ]
                            },
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {"weight": 1, "preference": {"matchExpressions": [{"key": "z", "operator": "Exists"}]}}
                            ],
                        },
                        "podAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "labelSelector": {"matchLabels": {"app": "cache"}},
                                    "namespaces": ["shared"],
                                    "topologyKey": "topology.kubernetes.io/zone",
                                }
                            ]
                        },
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "labelSelector": {
                                            "matchExpressions": [{"key": "app", "operator": "In", "values": ["chat"]}]
                                        },
                                        "namespaceSelector": {},
                                        "matchLabelKeys": ["pod-template-hash"],
                                        "topologyKey": "kubernetes.io/hostname",
                                    },
                                }
                            ]
                        },
                    }
                }
            )
        ),
        None,
    ),
    StructuralCase(
        "labels-and-annotations",
        _with_metadata(ai_model(model_spec()), labels={"a": "b"}, annotations={"c": "d"}),
        None,
    ),
)
