"""One table of CEL cases, shared by the pydantic parity test (tests/unit) and the API server one (e2e).

For every CEL rule of the CRDs: whole-resource manifests (camelCase, as a user writes them) that the rule
accepts, and manifests that break that rule and no other, so both sides must reject them with its message.
Good manifests sit close to the rule's edge, so that a twin stricter than its CEL rule fails too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servlane_api.kube_labels import LABEL_KEY_SHAPE

Manifest = dict[str, Any]

API_VERSION = "servlane.dev/v1alpha1"


SECRET = {"name": "tokens", "key": "hf"}


def ai_model(spec: Manifest, name: str = "cel-model") -> Manifest:
    return {"apiVersion": API_VERSION, "kind": "AIModel", "metadata": {"name": name}, "spec": spec}


def ai_feature(spec: Manifest, name: str = "cel-feature") -> Manifest:
    return {"apiVersion": API_VERSION, "kind": "AIFeature", "metadata": {"name": name}, "spec": spec}


def model_spec(**fields: Any) -> Manifest:
    """A minimal valid AIModel spec (weights baked into the image), with `fields` on top, in camelCase."""
    return {"source": {"uri": "/models/m"}, **fields}


def feature_spec(**fields: Any) -> Manifest:
    return {"model": "m1", **fields}


def autoscaled(**autoscaling: Any) -> Manifest:
    return ai_model(model_spec(autoscaling={"maxReplicas": 3, **autoscaling}))


def steps(*percentages: int) -> Manifest:
    return ai_feature(feature_spec(rollout={"steps": list(percentages)}))


def adapter_from(source: str) -> Manifest:
    return ai_model(model_spec(adapters=[{"name": "sql", "source": source}]))


def node_requirements(*requirements: Manifest) -> Manifest:
    """An AIModel whose pods need a node where every requirement holds."""
    term = {"matchExpressions": list(requirements)}
    required = {"nodeSelectorTerms": [term]}
    return ai_model(model_spec(scheduling={"affinity": {"nodeAffinity": {ON_SCHEDULING: required}}}))


def pod_affinity_term(**term: Any) -> Manifest:
    """An AIModel whose pods prefer nodes without the pods of `term` (topologyKey given unless in `term`)."""
    weighted = {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", **term}}
    preferred = {"preferredDuringSchedulingIgnoredDuringExecution": [weighted]}
    return ai_model(model_spec(scheduling={"affinity": {"podAntiAffinity": preferred}}))


def label_requirements(*requirements: Manifest) -> Manifest:
    return pod_affinity_term(labelSelector={"matchExpressions": list(requirements)})


def values_cases(
    name: str, whose: str, requirements: Callable[..., Manifest], operators: str
) -> tuple[RuleCases, RuleCases]:
    """The cases of the two rules every requirement's values follow (servlane_api.affinity._values_rules): In
    and NotIn need some, Exists and DoesNotExist take none."""
    given = {"key": "pool", "values": ["a", "b"]}
    return (
        RuleCases(
            f"{name}-values",
            f"{whose} requirement with operator In or NotIn needs at least one value (operators: {operators})",
            good=(
                requirements({**given, "operator": "In", "values": ["a"]}),
                requirements({**given, "operator": "NotIn"}),
                requirements({"key": "pool", "operator": "Exists"}),
            ),
            bad=(
                requirements({"key": "pool", "operator": "In"}),
                requirements({**given, "operator": "NotIn", "values": []}),
            ),
        ),
        RuleCases(
            f"{name}-no-values",
            f"{whose} requirement with operator Exists or DoesNotExist takes no values",
            good=(
                requirements({"key": "pool", "operator": "DoesNotExist"}),
                requirements({**given, "operator": "Exists", "values": []}),
            ),
            bad=(
                requirements({**given, "operator": "Exists", "values": ["a"]}),
                requirements({**given, "operator": "DoesNotExist", "values": ["a"]}),
            ),
        ),
    )


ON_SCHEDULING = "requiredDuringSchedulingIgnoredDuringExecution"
LONGEST_LABEL_KEY = "p" * 253 + "/" + "k" * 63
PREFIX_TOO_LONG = "p" * 254 + "/k"


# DNS-1123 subdomains (labels of at most 63) of 253 and 254 characters.
CLAIM_253 = ".".join(("a" * 63, "b" * 63, "c" * 63, "d" * 61))
CLAIM_254 = ".".join(("a" * 63, "b" * 63, "c" * 63, "d" * 62))

# Source forms both validators accept, each close to an edge of the grammar (servlane_api.aimodel).
GOOD_SOURCES = (
    "hf://Qwen/Qwen2.5-7B-Instruct@main",
    "hf://org/name",
    "hf://org_1/name.v2@refs/pr/1",
    "hf://org/name@0123456789abcdef0123456789abcdef01234567",
    "pvc://weights/qwen/7b",
    "pvc://weights",
    "pvc://team.weights-1/v1.5/model_a",
    "s3://bucket/qwen",
    "s3://my.bucket-1",
    "oci://registry.example.com/models/qwen:v1.5",
    "oci://localhost:5000/m",
    "oci://localhost/team__a/qwen--7b",
    "oci://registry:5000/models/qwen@sha256:" + "0123456789abcdef" * 4,
    "oci://10.0.0.1:5000/m_1.x:" + "t" * 128,
    "/models/qwen",
    "/m",
    # What standalone mode resolves pkg:// and ~ to: hidden directories and dotted names are fine.
    "/work/.venv/lib/python3.11/site-packages/tiny_model/model",
    "/root/.cache/hub/models--org--name/snapshots/abc",
)
# Dangerous or malformed forms: each breaks the source grammar and nothing else (no system directory).
BAD_SOURCES = (
    "ftp://host/model",
    "hf://Qwen",
    "models/qwen",
    # RE2's $ ends the text; Python's re.match would accept the trailing newline.
    "/models/qwen\n",
    "/models/../secrets",
    "/models/./qwen",
    "/models/..",
    "/..",
    "/",
    "/models//qwen",
    "/models/qwen/",
    "/models\\..\\secrets",
    "/models/%2e%2e/secrets",
    "/models%2fqwen",
    "/models/qwen 7b",
    "/models/\tqwen",
    "/models/qwen\u0000",
    "/models/qwen\u001b[0m",
    "~/models",
    "/models/~root",
    "/models/-rf",
    "/models/qwen?revision=main",
    "/models/qwen#frag",
    "/models/qw:en",
    "hf://user:token@org/name",
    "hf://org/name@../../secrets",
    "hf://org/name@-main",
    "hf://org/na..me",
    "hf://-org/name",
    "hf://org/name/extra",
    "hf://org/name@main?x=1",
    "pvc://Weights/qwen",
    "pvc://weights..x/qwen",
    "pvc://weights/../other",
    "pvc://user@weights/qwen",
    "pvc://weights:8080/qwen",
    "pvc://-weights/qwen",
    "pvc://" + "w" * 64 + "/qwen",
    "s3://Bucket/qwen",
    "s3://bucket..x/qwen",
    "s3://bucket-/qwen",
    "s3://key:secret@bucket/qwen",
    "s3://bucket/qwen/../../x",
    # An oci:// registry is explicit (Docker Hub is never implied), names are lowercase, tags hold no '..'.
    "oci://registry/models/qwen",
    "oci://models/qwen:v1",
    "oci://Registry.example.com/qwen",
    "oci://registry.example.com/Qwen",
    "oci://registry.example.com",
    "oci://registry.example.com/",
    "oci://registry.example.com/models//qwen",
    "oci://registry.example.com/models/../qwen",
    "oci://registry.example.com/qwen:v1..5",
    "oci://registry.example.com/qwen:.v1",
    "oci://registry.example.com/qwen:-v1",
    "oci://registry.example.com/qwen:v1:v2",
    "oci://registry.example.com/qwen@sha256:abc",
    "oci://registry.example.com/qwen@md5:" + "0" * 32,
    "oci://registry.example.com/qwen:v1@sha256:" + "0" * 64,
    "oci://user:token@registry.example.com/qwen",
    "oci://registry.example.com:port/qwen",
    "oci://registry.example.com/qwen?tag=v1",
    "oci://registry.example.com/qwen#v1",
    "oci:///models/qwen",
)
# Well-formed paths into the kernel's, the kubelet's and the runtime's directories.
SYSTEM_SOURCES = (
    "/proc/self/environ",
    "/sys/kernel",
    "/dev/shm",
    "/etc/passwd",
    "/run/secrets/kubernetes.io/serviceaccount",
    "/var/run/secrets/kubernetes.io/serviceaccount",
    "/var/lib/kubelet/pods",
    "/boot",
)

CPU = {"cpu": "1"}
SPLIT_60_40 = [{"model": "a", "weight": 60}, {"model": "b", "weight": 40}]


@dataclass(frozen=True)
class RuleCases:
    """The cases of one CEL rule, named by its message: every bad manifest is rejected with exactly it."""

    name: str
    message: str
    good: tuple[Manifest, ...]
    bad: tuple[Manifest, ...]


@dataclass(frozen=True)
class Case:
    """One manifest and what both validators must say: None to accept it, else the one rule message."""

    id: str
    manifest: Manifest
    rejected_with: str | None


CEL_CASES: tuple[RuleCases, ...] = (
    # --- AIModel ---
    RuleCases(
        "model-name-length",
        "metadata.name must be at most 57 characters",
        good=(ai_model(model_spec(), name="m" * 57),),
        bad=(ai_model(model_spec(), name="m" * 58),),
    ),
    RuleCases(
        "toleration-exists-takes-no-value",
        "a toleration with operator Exists takes no value",
        good=(ai_model(model_spec(scheduling={"tolerations": [{"key": "gpu", "operator": "Exists", "value": ""}]})),),
        bad=(ai_model(model_spec(scheduling={"tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]})),),
    ),
    RuleCases(
        "toleration-without-key-is-exists",
        "a toleration without a key must have operator Exists (it then tolerates every taint)",
        good=(ai_model(model_spec(scheduling={"tolerations": [{"operator": "Exists"}]})),),
        bad=tuple(
            ai_model(model_spec(scheduling={"tolerations": [toleration]}))
            for toleration in ({"operator": "Equal", "value": "x"}, {"effect": "NoSchedule"})
        ),
    ),
    RuleCases(
        "toleration-seconds-need-no-execute",
        "tolerationSeconds needs effect NoExecute",
        good=(
            ai_model(
                model_spec(scheduling={"tolerations": [{"key": "k", "effect": "NoExecute", "tolerationSeconds": 30}]})
            ),
        ),
        bad=(
            ai_model(
                model_spec(scheduling={"tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 30}]})
            ),
        ),
    ),
    RuleCases(
        "env-value-or-value-from",
        "an env var takes value or valueFrom, not both",
        good=(
            ai_model(
                model_spec(env=[{"name": "A", "value": "x"}, {"name": "B", "valueFrom": {"secretKeyRef": SECRET}}])
            ),
            ai_model(model_spec(env=[{"name": "A", "value": "", "valueFrom": {"secretKeyRef": SECRET}}])),
        ),
        bad=(ai_model(model_spec(env=[{"name": "A", "value": "x", "valueFrom": {"secretKeyRef": SECRET}}])),),
    ),
    RuleCases(
        "env-value-from-one-source",
        "valueFrom takes exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef",
        good=(
            ai_model(model_spec(env=[{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}])),
            ai_model(model_spec(env=[{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}])),
            ai_model(model_spec(env=[{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}}])),
        ),
        bad=(
            ai_model(model_spec(env=[{"name": "A", "valueFrom": {}}])),
            ai_model(
                model_spec(
                    env=[
                        {
                            "name": "A",
                            "valueFrom": {"secretKeyRef": SECRET, "fieldRef": {"fieldPath": "metadata.name"}},
                        }
                    ]
                )
            ),
        ),
    ),
    RuleCases(
        "env-resource-divisor",
        "resourceFieldRef.divisor must be one of 1m, 1 for cpu, else one of 1, 1k, 1M, 1G, 1T, 1P, 1E, 1Ki, 1Mi, "
        "1Gi, 1Ti, 1Pi, 1Ei",
        good=tuple(
            ai_model(model_spec(env=[{"name": "A", "valueFrom": {"resourceFieldRef": ref}}]))
            for ref in (
                {"resource": "limits.cpu", "divisor": "1m"},
                {"resource": "requests.cpu", "divisor": "1"},
                {"resource": "limits.memory", "divisor": "1Mi"},
                {"resource": "requests.hugepages-2Mi", "divisor": "1Ei"},
                {"resource": "limits.ephemeral-storage"},
            )
        ),
        bad=tuple(
            ai_model(model_spec(env=[{"name": "A", "valueFrom": {"resourceFieldRef": ref}}]))
            for ref in (
                {"resource": "limits.cpu", "divisor": "3"},
                {"resource": "limits.cpu", "divisor": "1Mi"},
                {"resource": "limits.memory", "divisor": "1m"},
                {"resource": "requests.ephemeral-storage", "divisor": "2Gi"},
            )
        ),
    ),
    RuleCases(
        "toleration-key-prefix",
        "a toleration key's prefix (before '/') must be at most 253 characters",
        good=(
            ai_model(
                model_spec(scheduling={"tolerations": [{"key": "p" * 253 + "/" + "k" * 63, "operator": "Exists"}]})
            ),
        ),
        bad=(ai_model(model_spec(scheduling={"tolerations": [{"key": "p" * 254 + "/k", "operator": "Exists"}]})),),
    ),
    RuleCases(
        "node-selector-label-keys",
        "nodeSelector keys must be label keys (an optional DNS prefix of at most 253 characters and '/', then at "
        "most 63 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit)",
        good=(
            ai_model(model_spec(scheduling={"nodeSelector": {"node.example.com/pool": "gpu", "zone": "a_1"}})),
            ai_model(model_spec(scheduling={"nodeSelector": {"p" * 253 + "/" + "n" * 63: "x"}})),  # the longest
        ),
        bad=tuple(
            ai_model(model_spec(scheduling={"nodeSelector": {key: "x"}}))
            for key in ("bad key!", "Example.com/pool", "pool-", "/pool", "n" * 64, "p" * 254 + "/n")
        ),
    ),
    *values_cases("label-selector", "a label selector's", label_requirements, "In, NotIn, Exists, DoesNotExist"),
    RuleCases(
        "label-selector-key",
        f"a label selector's key must be a label key {LABEL_KEY_SHAPE}",
        good=(label_requirements({"key": LONGEST_LABEL_KEY, "operator": "Exists"}),),
        bad=(label_requirements({"key": PREFIX_TOO_LONG, "operator": "Exists"}),),
    ),
    RuleCases(
        "match-labels-keys",
        f"matchLabels keys must be label keys {LABEL_KEY_SHAPE}",
        good=(
            pod_affinity_term(labelSelector={"matchLabels": {"app.kubernetes.io/name": "chat", LONGEST_LABEL_KEY: ""}}),
            pod_affinity_term(labelSelector={}),
        ),
        bad=tuple(
            pod_affinity_term(labelSelector={"matchLabels": {key: "x"}})
            for key in ("bad key!", "/app", PREFIX_TOO_LONG)
        ),
    ),
    *values_cases("node-selector", "a node selector's", node_requirements, "In, NotIn, Exists, DoesNotExist, Gt, Lt"),
    RuleCases(
        "node-selector-integer",
        "a node selector's requirement with operator Gt or Lt takes exactly one value, an integer",
        good=(
            node_requirements({"key": "gpu-memory", "operator": "Gt", "values": ["40"]}),
            node_requirements({"key": "gpu-memory", "operator": "Lt", "values": ["-" + "9" * 18]}),
            node_requirements({"key": "gpu-memory", "operator": "In", "values": ["a", "b"]}),
        ),
        bad=(
            node_requirements({"key": "gpu-memory", "operator": "Gt"}),
            node_requirements({"key": "gpu-memory", "operator": "Gt", "values": ["40", "80"]}),
            node_requirements({"key": "gpu-memory", "operator": "Lt", "values": ["40Gi"]}),
            node_requirements({"key": "gpu-memory", "operator": "Lt", "values": ["9" * 19]}),
        ),
    ),
    RuleCases(
        "node-selector-key",
        f"a node selector's key must be a label key {LABEL_KEY_SHAPE}",
        good=(node_requirements({"key": LONGEST_LABEL_KEY, "operator": "Exists"}),),
        bad=(node_requirements({"key": PREFIX_TOO_LONG, "operator": "Exists"}),),
    ),
    RuleCases(
        "topology-key",
        f"topologyKey must be a label key {LABEL_KEY_SHAPE}",
        good=(pod_affinity_term(topologyKey=LONGEST_LABEL_KEY),),
        bad=(pod_affinity_term(topologyKey=PREFIX_TOO_LONG),),
    ),
    RuleCases(
        "match-label-keys",
        f"each of matchLabelKeys must be a label key {LABEL_KEY_SHAPE}",
        good=(pod_affinity_term(labelSelector={}, matchLabelKeys=["pod-template-hash", LONGEST_LABEL_KEY]),),
        bad=(
            pod_affinity_term(labelSelector={}, matchLabelKeys=["bad key!"]),
            pod_affinity_term(labelSelector={}, matchLabelKeys=[PREFIX_TOO_LONG]),
        ),
    ),
    RuleCases(
        "mismatch-label-keys",
        f"each of mismatchLabelKeys must be a label key {LABEL_KEY_SHAPE}",
        good=(pod_affinity_term(labelSelector={}, mismatchLabelKeys=["tenant", LONGEST_LABEL_KEY]),),
        bad=(pod_affinity_term(labelSelector={}, mismatchLabelKeys=["-tenant"]),),
    ),
    RuleCases(
        "label-keys-need-a-selector",
        "matchLabelKeys and mismatchLabelKeys need a labelSelector",
        good=(
            pod_affinity_term(labelSelector={"matchLabels": {"app": "chat"}}, matchLabelKeys=["pod-template-hash"]),
            pod_affinity_term(matchLabelKeys=[], mismatchLabelKeys=[]),
        ),
        bad=(pod_affinity_term(matchLabelKeys=["pod-template-hash"]), pod_affinity_term(mismatchLabelKeys=["tenant"])),
    ),
    RuleCases(
        "model-name-dns-label",
        "metadata.name must consist of lowercase letters, digits and '-', start with a letter and end with a letter "
        "or digit (it names the model's Service and Deployment)",
        good=(ai_model(model_spec(), name="llama-v2"), ai_model(model_spec(), name="m")),
        bad=tuple(ai_model(model_spec(), name=name) for name in ("llama.v2", "2llama", "llama-")),
    ),
    RuleCases(
        "source-uri",
        "source.uri must be hf://org/name[@revision], pvc://claim/path, s3://bucket/path, "
        "oci://registry.host/repository[:tag|@sha256:digest], or an absolute path in the image, each path segment "
        "letters, digits, '_', '-' and inner dots (no '.' or '..' segment, '//', '%', '~', '\\', spaces, '?', '#' "
        "or '@')",
        good=tuple(ai_model(model_spec(source={"uri": uri})) for uri in GOOD_SOURCES),
        bad=tuple(ai_model(model_spec(source={"uri": uri})) for uri in BAD_SOURCES),
    ),
    RuleCases(
        "source-system-path",
        "source.uri must not be a path under /proc, /sys, /dev, /etc, /run, /var/run, /var/lib/kubelet or /boot",
        # Near misses: directories that only start like a system one.
        good=tuple(ai_model(model_spec(source={"uri": uri})) for uri in ("/etcetera/m", "/devices/m", "/var/models")),
        bad=tuple(ai_model(model_spec(source={"uri": uri})) for uri in SYSTEM_SOURCES),
    ),
    RuleCases(
        "source-claim-length",
        "source.uri's pvc:// claim name must be at most 253 characters",
        good=(ai_model(model_spec(source={"uri": f"pvc://{CLAIM_253}/qwen"})),),
        bad=(ai_model(model_spec(source={"uri": f"pvc://{CLAIM_254}/qwen"})),),
    ),
    RuleCases(
        "source-s3-bucket",
        "source.uri's s3:// bucket must be a name S3 accepts: 3 to 63 characters, no IP address, no xn-- or sthree- "
        "prefix, no -s3alias, --ol-s3 or --x-s3 suffix",
        good=tuple(
            ai_model(model_spec(source={"uri": uri}))
            for uri in (
                "s3://192-168-1-1/qwen",
                "s3://1.2.3/qwen",
                "s3://bucket-xn--1",
                "s3://s3alias-bucket/x",
                "s3://abc",
                "s3://" + "b" * 63 + "/qwen",
            )
        ),
        bad=tuple(
            ai_model(model_spec(source={"uri": uri}))
            for uri in (
                "s3://192.168.1.1/qwen",
                "s3://10.0.0.1",
                "s3://xn--bucket/qwen",
                "s3://sthree-bucket/qwen",
                "s3://bucket-s3alias/qwen",
                "s3://bucket--ol-s3",
                "s3://bucket--x-s3/qwen",
                "s3://ab/qwen",
                "s3://" + "b" * 32 + "." + "b" * 32 + "/qwen",  # 65 characters
            )
        ),
    ),
    RuleCases(
        "source-credentials",
        "source.credentialsSecret applies only to hf://, s3:// and oci:// sources",
        good=(
            ai_model(model_spec(source={"uri": "hf://org/name", "credentialsSecret": "hf-token"})),
            ai_model(model_spec(source={"uri": "s3://bucket/m", "credentialsSecret": "aws"})),
            ai_model(model_spec(source={"uri": "oci://registry.example.com/m:v1", "credentialsSecret": "pull"})),
            ai_model(model_spec(source={"uri": "pvc://weights/m"})),
        ),
        bad=(
            ai_model(model_spec(source={"uri": "/models/m", "credentialsSecret": "tok"})),
            ai_model(model_spec(source={"uri": "pvc://weights/m", "credentialsSecret": "tok"})),
        ),
    ),
    RuleCases(
        "source-s3-options",
        "source.s3 applies only to s3:// sources",
        good=(
            ai_model(model_spec(source={"uri": "s3://bucket/m", "s3": {"endpoint": "http://store:8333"}})),
            ai_model(model_spec(source={"uri": "s3://bucket/m", "s3": {"pathStyle": False}})),
            ai_model(model_spec(source={"uri": "hf://org/name"})),
        ),
        bad=(
            ai_model(model_spec(source={"uri": "hf://org/name", "s3": {"region": "us-east-1"}})),
            ai_model(model_spec(source={"uri": "/models/m", "s3": {"endpoint": "http://store:8333"}})),
        ),
    ),
    RuleCases(
        "autoscaling-bounds",
        "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
        good=(ai_model(model_spec(resources=CPU, autoscaling={"minReplicas": 2, "maxReplicas": 2})),),
        bad=(ai_model(model_spec(resources=CPU, autoscaling={"minReplicas": 4, "maxReplicas": 2})),),
    ),
    RuleCases(
        "cache-one-volume",
        "cache needs exactly one of persistentVolumeClaim or emptyDirSizeLimit",
        good=(
            ai_model(model_spec(cache={"persistentVolumeClaim": "model-cache"})),
            ai_model(model_spec(cache={"emptyDirSizeLimit": "50Gi"})),
        ),
        bad=(
            ai_model(model_spec(cache={"persistentVolumeClaim": "model-cache", "emptyDirSizeLimit": "50Gi"})),
            ai_model(model_spec(cache={})),
        ),
    ),
    RuleCases(
        "replicas-or-autoscaling",
        "set either replicas or autoscaling, not both",
        good=(
            ai_model(model_spec(replicas=2)),
            ai_model(model_spec(resources=CPU, autoscaling={"maxReplicas": 3})),
            ai_model(model_spec()),
        ),
        bad=(
            ai_model(model_spec(replicas=2, resources=CPU, autoscaling={"maxReplicas": 3})),
            # has() is about presence: a zero is set.
            ai_model(model_spec(replicas=0, resources=CPU, autoscaling={"maxReplicas": 3})),
        ),
    ),
    RuleCases(
        "scale-to-zero-after-min",
        "autoscaling.scaleToZeroAfter must be at least 1s",
        good=(
            autoscaled(minReplicas=0, scaleToZeroAfter="1s"),
            autoscaled(minReplicas=0, scaleToZeroAfter="1000ms"),
            autoscaled(scaleToZeroAfter="1h30m"),
        ),
        bad=(autoscaled(minReplicas=0, scaleToZeroAfter="999ms"), autoscaled(scaleToZeroAfter="0s")),
    ),
    RuleCases(
        "scale-to-zero-after-max",
        "autoscaling.scaleToZeroAfter must be at most 2562047h",
        good=(autoscaled(minReplicas=0, scaleToZeroAfter="2562047h"), autoscaled(scaleToZeroAfter="2562046h59m")),
        # Go counts whole nanoseconds (CEL's duration()): 100 ns past the bound is past it; float seconds lost them.
        bad=(
            autoscaled(minReplicas=0, scaleToZeroAfter="2562047h1s"),
            autoscaled(minReplicas=0, scaleToZeroAfter="2562047h0.0000001s"),
        ),
    ),
    RuleCases(
        "kv-cache-target-vllm-only",
        "autoscaling.targetKVCacheUsage applies to the vllm engine only (the transformers engine reports no "
        "KV-cache use)",
        good=(
            autoscaled(targetKVCacheUsage=0.8),
            ai_model(model_spec(engine="transformers", autoscaling={"maxReplicas": 3})),
        ),
        bad=(ai_model(model_spec(engine="transformers", autoscaling={"maxReplicas": 3, "targetKVCacheUsage": 0.8})),),
    ),
    RuleCases(
        "gpu-memory-utilization-vllm-only",
        "engineOptions.gpuMemoryUtilization applies to the vllm engine only",
        good=(
            ai_model(model_spec(engine="vllm", engineOptions={"gpuMemoryUtilization": 0.9})),
            ai_model(model_spec(engineOptions={"gpuMemoryUtilization": 0.9})),  # vllm is the default
            ai_model(model_spec(engine="transformers", engineOptions={"dtype": "float32"})),
        ),
        bad=(ai_model(model_spec(engine="transformers", engineOptions={"gpuMemoryUtilization": 0.5})),),
    ),
    RuleCases(
        "cpu-kv-cache-vllm-only",
        "engineOptions.cpuKVCacheGiB applies to the vllm engine only",
        good=(
            ai_model(model_spec(engine="vllm", engineOptions={"cpuKVCacheGiB": 4})),
            ai_model(model_spec(engineOptions={"cpuKVCacheGiB": 1})),  # vllm is the default
            ai_model(model_spec(engine="transformers")),
        ),
        bad=(ai_model(model_spec(engine="transformers", engineOptions={"cpuKVCacheGiB": 2})),),
    ),
    RuleCases(
        "transformers-quantization",
        "the transformers engine supports only bitsandbytes quantization",
        good=(
            ai_model(model_spec(engine="transformers", engineOptions={"quantization": "bitsandbytes"})),
            ai_model(model_spec(engine="vllm", engineOptions={"quantization": "awq"})),
            ai_model(model_spec(engine="transformers")),
        ),
        bad=(
            ai_model(model_spec(engine="transformers", engineOptions={"quantization": "awq"})),
            ai_model(model_spec(engine="transformers", engineOptions={"quantization": "fp8"})),
        ),
    ),
    RuleCases(
        "transformers-tool-call-parser",
        "the transformers and llamacpp engines read only hermes tool calls: another engineOptions.toolCallParser "
        "needs engine vllm",
        good=(
            ai_model(model_spec(engine="transformers", engineOptions={"toolCallParser": "hermes"})),
            ai_model(model_spec(engine="llamacpp", engineOptions={"toolCallParser": "hermes"})),
            ai_model(model_spec(engine="vllm", engineOptions={"toolCallParser": "llama3_json"})),
            ai_model(model_spec(engineOptions={"toolCallParser": "mistral"})),  # vllm is the default
            ai_model(model_spec(engine="transformers")),
        ),
        bad=(
            ai_model(model_spec(engine="transformers", engineOptions={"toolCallParser": "pythonic"})),
            # Names are compared whole and case-sensitively, as vLLM looks them up.
            ai_model(model_spec(engine="transformers", engineOptions={"toolCallParser": "hermes2"})),
            ai_model(model_spec(engine="llamacpp", engineOptions={"toolCallParser": "llama3_json"})),
        ),
    ),
    RuleCases(
        "llamacpp-options-llamacpp-only",
        "engineOptions.llamacpp applies to the llamacpp engine only",
        good=(
            ai_model(model_spec(engine="llamacpp", engineOptions={"llamacpp": {"threads": 4, "ggufFile": "m.gguf"}})),
            ai_model(model_spec(engine="llamacpp")),
        ),
        bad=(
            ai_model(model_spec(engine="transformers", engineOptions={"llamacpp": {"threads": 4}})),
            ai_model(model_spec(engineOptions={"llamacpp": {}})),  # vllm is the default
        ),
    ),
    RuleCases(
        "llamacpp-no-quantization",
        "engine llamacpp takes no engineOptions.quantization: the GGUF file's quantization is what it runs",
        good=(ai_model(model_spec(engine="llamacpp", engineOptions={"maxModelLen": 4096})),),
        bad=(ai_model(model_spec(engine="llamacpp", engineOptions={"quantization": "awq"})),),
    ),
    RuleCases(
        "llamacpp-no-dtype",
        "engine llamacpp takes no engineOptions.dtype: the GGUF file's tensor types are what it runs",
        good=(ai_model(model_spec(engine="llamacpp", engineOptions={"dtype": "auto"})),),
        bad=(ai_model(model_spec(engine="llamacpp", engineOptions={"dtype": "float16"})),),
    ),
    RuleCases(
        "llamacpp-cpu-only",
        "engine llamacpp runs on CPUs (its build in the runtime image has no GPU code): set resources.gpus to 0",
        good=(
            ai_model(model_spec(engine="llamacpp", resources={"cpu": "4", "memory": "8Gi"})),
            ai_model(model_spec(engine="transformers", resources={"gpus": 1})),
        ),
        bad=(ai_model(model_spec(engine="llamacpp", resources={"gpus": 1})),),
    ),
    RuleCases(
        "llamacpp-no-adapters",
        "engine llamacpp serves no LoRA adapters",
        good=(ai_model(model_spec(engine="transformers", engineOptions={"enableAdapters": True})),),
        bad=(
            ai_model(model_spec(engine="llamacpp", engineOptions={"enableAdapters": True})),
            ai_model(model_spec(engine="llamacpp", adapters=[{"name": "sql", "source": "/models/sql"}])),
        ),
    ),
    RuleCases(
        "llamacpp-no-extra-args",
        "engine llamacpp takes no engineOptions.extraArgs: its settings are engineOptions.llamacpp",
        good=(ai_model(model_spec(engine="vllm", engineOptions={"extraArgs": ["--enable-prefix-caching"]})),),
        bad=(ai_model(model_spec(engine="llamacpp", engineOptions={"extraArgs": ["--threads", "4"]})),),
    ),
    RuleCases(
        "adapter-source",
        "adapter source must be hf://org/name[@revision], pvc://claim/path, or an absolute path, each path segment "
        "letters, digits, '_', '-' and inner dots (no '.' or '..' segment, '//', '%', '~', '\\', spaces, '?', '#' "
        "or '@')",
        good=tuple(adapter_from(uri) for uri in GOOD_SOURCES if not uri.startswith(("s3://", "oci://"))),
        bad=(
            adapter_from("s3://bucket/sql"),  # the runtime does not fetch adapters from S3
            adapter_from("oci://registry.example.com/sql:v1"),  # nor from an image (a model's volume only)
            *(adapter_from(uri) for uri in BAD_SOURCES if not uri.startswith(("s3://", "oci://"))),
        ),
    ),
    RuleCases(
        "adapter-system-path",
        "adapter source must not be a path under /proc, /sys, /dev, /etc, /run, /var/run, /var/lib/kubelet or /boot",
        good=(adapter_from("/etcetera/sql"),),
        bad=tuple(adapter_from(uri) for uri in SYSTEM_SOURCES),
    ),
    RuleCases(
        "adapter-claim-length",
        "adapter source's pvc:// claim name must be at most 253 characters",
        good=(adapter_from(f"pvc://{CLAIM_253}/sql"),),
        bad=(adapter_from(f"pvc://{CLAIM_254}"),),
    ),
    RuleCases(
        "adapter-names-unique",
        "adapters must have different names",
        good=(
            ai_model(model_spec(adapters=[{"name": "a", "source": "/a"}, {"name": "b", "source": "/a"}])),
            ai_model(model_spec(adapters=[])),
        ),
        bad=(ai_model(model_spec(adapters=[{"name": "a", "source": "/a"}, {"name": "a", "source": "/b"}])),),
    ),
    RuleCases(
        "adapter-not-the-served-name",
        "an adapter must not be named like the model's servedModelName",
        good=(
            ai_model(model_spec(servedModelName="base", adapters=[{"name": "base-sql", "source": "/a"}])),
            ai_model(model_spec(adapters=[{"name": "cel-model", "source": "/a"}])),  # no served name set
        ),
        bad=(ai_model(model_spec(servedModelName="base", adapters=[{"name": "base", "source": "/a"}])),),
    ),
    RuleCases(
        "adapters-generate-only",
        "adapters apply to task generate only",
        good=(
            ai_model(model_spec(task="generate", adapters=[{"name": "a", "source": "/a"}])),
            ai_model(model_spec(task="embed")),
        ),
        bad=(ai_model(model_spec(task="embed", adapters=[{"name": "a", "source": "/a"}])),),
    ),
    RuleCases(
        "env-reserved-names",
        "env must not set SERVLANE_RUNTIME_CONFIG, HF_HOME or HOME: the operator sets them on every model pod",
        good=(
            ai_model(model_spec(env=[{"name": "LOG_LEVEL", "value": "debug"}])),
            # Names are case-sensitive and compared whole.
            ai_model(model_spec(env=[{"name": "home", "value": "/x"}, {"name": "HF_HOME_EXTRA", "value": "1"}])),
            ai_model(model_spec(env=[])),
        ),
        bad=(
            ai_model(model_spec(env=[{"name": "SERVLANE_RUNTIME_CONFIG", "value": "{}"}])),
            ai_model(model_spec(env=[{"name": "LOG_LEVEL", "value": "debug"}, {"name": "HF_HOME", "value": "/hf"}])),
            ai_model(model_spec(env=[{"name": "HOME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])),
        ),
    ),
    RuleCases(
        "env-unique-names",
        "env must not set the same variable twice",
        good=(
            ai_model(model_spec(env=[{"name": "A", "value": "1"}, {"name": "a", "value": "1"}])),
            ai_model(model_spec(env=[{"name": "A", "value": "1"}, {"name": "B", "value": "1"}])),
        ),
        bad=(
            ai_model(model_spec(env=[{"name": "A", "value": "1"}, {"name": "A", "value": "1"}])),
            ai_model(model_spec(env=[{"name": "A", "value": "1"}, {"name": "B"}, {"name": "A", "value": "2"}])),
        ),
    ),
    RuleCases(
        "served-name-no-slash",
        "servedModelName must not contain '/': the gateway reads 'a/b' as model 'b' in namespace 'a' "
        "(use e.g. 'org.model' or 'org-model')",
        good=(
            ai_model(model_spec(servedModelName="org.qwen-2.5:7b_instruct")),
            ai_model(model_spec()),  # defaults to metadata.name, which never holds '/'
        ),
        bad=(
            ai_model(model_spec(servedModelName="Qwen/Qwen2.5-7B-Instruct")),
            ai_model(model_spec(servedModelName="prod/chat")),
            ai_model(model_spec(servedModelName="chat/")),
        ),
    ),
    # --- AIFeature ---
    RuleCases(
        "feature-name-length",
        "metadata.name must be at most 253 characters",
        good=(ai_feature(feature_spec(), name="f" * 253),),
        bad=(ai_feature(feature_spec(), name="f" * 254),),
    ),
    RuleCases(
        "model-or-split",
        "set exactly one of model (a rollout target) or split (a fixed A/B split)",
        good=(ai_feature({"model": "m1"}), ai_feature({"split": SPLIT_60_40})),
        bad=(ai_feature({"model": "m1", "split": SPLIT_60_40}), ai_feature({})),
    ),
    RuleCases(
        "split-sums-to-100",
        "split weights must add up to 100",
        good=(ai_feature({"split": SPLIT_60_40}), ai_feature({"split": [{"model": "a", "weight": 100}]})),
        bad=(
            ai_feature({"split": [{"model": "a", "weight": 60}, {"model": "b", "weight": 30}]}),
            ai_feature({"split": [{"model": "a", "weight": 60}, {"model": "b", "weight": 41}]}),
        ),
    ),
    RuleCases(
        "rollout-step-range",
        "rollout.steps must be percentages between 1 and 100",
        good=(steps(1, 100), steps(100), ai_feature(feature_spec())),
        bad=(steps(50, 150), steps(0, 50), steps(101)),
    ),
    RuleCases(
        "rollout-steps-increasing",
        "rollout.steps must be increasing",
        good=(steps(5, 25, 50, 100), steps(99, 100)),
        bad=(steps(50, 25), steps(25, 25, 100), steps(10, 20, 15, 100)),
    ),
)


def flat_cases() -> list[Case]:
    """Every manifest of the table once, with a readable id, for pytest.mark.parametrize."""
    cases: list[Case] = []
    for rule in CEL_CASES:
        cases += [Case(f"{rule.name}-good-{i}", m, None) for i, m in enumerate(rule.good)]
        cases += [Case(f"{rule.name}-bad-{i}", m, rule.message) for i, m in enumerate(rule.bad)]
    return cases
