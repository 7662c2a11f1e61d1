"""Where an AIModel's weights and adapters come from: the source grammar (one, checked by CEL's RE2 and by
Python's re alike), the source kinds, ModelSource and Adapter."""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import Field

from servlane_api.cel import CelRule, CelValidated
from servlane_api.s3_source import S3Options

# A Kubernetes object name in the same namespace (a Secret, a Service).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Sources are read by the runtime and mounted by the kubelet, so every form is held to what a mount would
# accept without surprise (one grammar, written once, checked by CEL's RE2 and by Python's re alike):
# a path segment is letters, digits, '_' and '-', with inner single dots and an optional leading one
# ('.cache', 'v1.5'), so '.', '..', empty segments ('//'), a trailing '/', '%'-escapes, '\', '~', '?', '#',
# '@', ':', whitespace and control characters never get through, nor a segment that starts with '-'.
PATH_SEGMENT = r"\.?[A-Za-z0-9_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*"
SOURCE_PATH = rf"{PATH_SEGMENT}(?:/{PATH_SEGMENT})*"
# A Hub repo id part (org or name): letters, digits, '_', and single '-' or '.' between them, at most ~96.
HF_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_]|[-.][A-Za-z0-9_]){0,95}"
# A revision: a branch, tag or commit, or a ref such as refs/pr/1 (git refs hold no '..' and no leading '-').
HF_REVISION = r"[A-Za-z0-9_](?:[A-Za-z0-9_]|[-.][A-Za-z0-9_])*(?:/[A-Za-z0-9_](?:[A-Za-z0-9_]|[-.][A-Za-z0-9_])*)*"
HF_SOURCE = rf"hf://{HF_PART}/{HF_PART}(?:@{HF_REVISION})?"
# A PVC claim is a DNS-1123 subdomain: lowercase labels of at most 63 characters joined by single dots.
DNS_1123_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
PVC_SOURCE = rf"pvc://{DNS_1123_LABEL}(?:\.{DNS_1123_LABEL})*(?:/{SOURCE_PATH})?"
# An S3 bucket: lowercase labels joined by single dots (its length and reserved names: RESERVED_BUCKET below).
S3_SOURCE = rf"s3://{DNS_1123_LABEL}(?:\.{DNS_1123_LABEL})*(?:/{SOURCE_PATH})?"
# An OCI image of weights (mounted as an image volume): oci://<registry>/<repository>[:tag|@sha256:digest]. The
# registry is always explicit (a host with a dot or a port, or localhost), so a name never silently means
# Docker Hub; repository components as the distribution spec has them (lowercase, single '.' or '_', '__', '-'
# runs); a tag as Docker's but without '..' or a trailing '.'; a digest is sha256 only.
OCI_HOST = rf"(?:localhost|{DNS_1123_LABEL}(?:\.{DNS_1123_LABEL})+)"
OCI_REGISTRY = rf"(?:{OCI_HOST}(?::[0-9]{{1,5}})?|{DNS_1123_LABEL}:[0-9]{{1,5}})"
OCI_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
OCI_TAG = r"[A-Za-z0-9_](?:\.?[A-Za-z0-9_-]){0,127}"
OCI_SOURCE = rf"oci://{OCI_REGISTRY}/{OCI_COMPONENT}(?:/{OCI_COMPONENT})*(?::{OCI_TAG}|@sha256:[a-f0-9]{{64}})?"
IMAGE_SOURCE = rf"/{SOURCE_PATH}"
SOURCE_URI = rf"^(?:{HF_SOURCE}|{PVC_SOURCE}|{S3_SOURCE}|{OCI_SOURCE}|{IMAGE_SOURCE})$"
SOURCE_PATH_RULES = (
    "each path segment letters, digits, '_', '-' and inner dots (no '.' or '..' segment, '//', '%', '~', "
    "'\\', spaces, '?', '#' or '@')"
)
SOURCE_URI_MESSAGE = (
    "source.uri must be hf://org/name[@revision], pvc://claim/path, s3://bucket/path, "
    "oci://registry.host/repository[:tag|@sha256:digest], or an absolute path in the image, "
    f"{SOURCE_PATH_RULES}"
)
# Paths in the image under which the kernel, the kubelet and the container runtime put things that are no
# model's weights (process memory, devices, Secrets and tokens mounted into the pod): never a source.
# (Matched whole, as the grammar above, so that RE2's and Python's '$' cannot differ on a trailing newline.)
SYSTEM_PATH = r"^/(?:proc|sys|dev|etc|run|boot|var/run|var/lib/kubelet)(?:/.*)?$"
SYSTEM_PATH_MESSAGE = (
    "source.uri must not be a path under /proc, /sys, /dev, /etc, /run, /var/run, /var/lib/kubelet or /boot"
)
# What the grammar cannot count or exclude, as rules of their own: a claim name is at most 253 characters
# (a DNS-1123 subdomain), and S3 refuses buckets named like an IP address or with a reserved prefix or suffix.
CLAIM_TOO_LONG = r"^pvc://[^/]{254}.*$"
CLAIM_TOO_LONG_MESSAGE = "source.uri's pvc:// claim name must be at most 253 characters"
RESERVED_BUCKET = (
    r"^s3://(?:[^/]{1,2}|[^/]{64,}|[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+|xn--[^/]*|sthree-[^/]*|[^/]*-s3alias|[^/]*--ol-s3"
    r"|[^/]*--x-s3)(?:/.*)?$"
)
RESERVED_BUCKET_MESSAGE = (
    "source.uri's s3:// bucket must be a name S3 accepts: 3 to 63 characters, no IP address, no xn-- or sthree- "
    "prefix, no -s3alias, --ol-s3 or --x-s3 suffix"
)


class SourceKind(StrEnum):
    HF = "hf"
    PVC = "pvc"
    S3 = "s3"
    OCI = "oci"
    IMAGE = "image"


class ModelSource(CelValidated):
    cel_rules = (
        # RE2's $ is the end of the text; Python's re.match would also allow a trailing newline.
        CelRule(
            f"self.uri.matches(r'{SOURCE_URI}')",
            SOURCE_URI_MESSAGE,
            lambda source: re.fullmatch(SOURCE_URI, source.uri) is not None,
        ),
        CelRule(
            f"!self.uri.matches(r'{SYSTEM_PATH}')",
            SYSTEM_PATH_MESSAGE,
            lambda source: re.fullmatch(SYSTEM_PATH, source.uri) is None,
        ),
        CelRule(
            f"!self.uri.matches(r'{CLAIM_TOO_LONG}')",
            CLAIM_TOO_LONG_MESSAGE,
            lambda source: re.fullmatch(CLAIM_TOO_LONG, source.uri) is None,
        ),
        CelRule(
            f"!self.uri.matches(r'{RESERVED_BUCKET}')",
            RESERVED_BUCKET_MESSAGE,
            lambda source: re.fullmatch(RESERVED_BUCKET, source.uri) is None,
        ),
        # For oci:// the Secret is the pod's imagePullSecret (kubernetes.io/dockerconfigjson), never env.
        CelRule(
            "!has(self.credentialsSecret) || self.uri.startsWith('hf://') || self.uri.startsWith('s3://') "
            "|| self.uri.startsWith('oci://')",
            "source.credentialsSecret applies only to hf://, s3:// and oci:// sources",
            lambda source: source.credentials_secret is None or source.uri.startswith(("hf://", "s3://", "oci://")),
        ),
        CelRule(
            "!has(self.s3) || self.uri.startsWith('s3://')",
            "source.s3 applies only to s3:// sources",
            lambda source: source.s3 is None or source.uri.startswith("s3://"),
        ),
    )

    uri: str = Field(
        max_length=1024,
        description=(
            "Where the weights are: hf://org/name[@revision], pvc://claim/path, s3://bucket/path, "
            "oci://registry.host/repository[:tag|@sha256:digest] (an image of the weights, mounted read-only as "
            "an image volume), or an absolute path baked into the image."
        ),
    )
    credentials_secret: str | None = Field(
        default=None,
        pattern=DNS_LABEL,
        max_length=253,
        description="Secret in the same namespace whose keys become environment variables "
        "(HF_TOKEN for hf://, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY for s3://); for oci:// a "
        "kubernetes.io/dockerconfigjson Secret, the pod's imagePullSecret (never environment variables).",
    )
    s3: S3Options | None = Field(
        default=None,
        description="For s3://: the store's endpoint, region, addressing style and stall timeout. Default: AWS S3, "
        "the bucket's own region, a 60 s stall timeout. The keys come from credentialsSecret.",
    )

    @property
    def kind(self) -> SourceKind:
        scheme = self.uri.split("://", 1)[0] if "://" in self.uri else ""
        kinds = {"hf": SourceKind.HF, "pvc": SourceKind.PVC, "s3": SourceKind.S3, "oci": SourceKind.OCI}
        return kinds.get(scheme, SourceKind.IMAGE)

    def oci_reference(self) -> str:
        """For oci://registry/repository[:tag|@digest]: the image reference a kubelet pulls."""
        if not self.uri.startswith("oci://"):
            raise ValueError(f"{self.uri!r} is not an oci:// source")
        return self.uri.removeprefix("oci://")

    def pvc_claim_and_path(self) -> tuple[str, str]:
        """For pvc://claim/path: the claim name and the path inside it ('' for its root)."""
        match = re.match(r"^pvc://([^/]+)/?(.*)$", self.uri)
        if match is None:
            raise ValueError(f"{self.uri!r} is not a pvc:// source")
        return match.group(1), match.group(2)


# An adapter's files: from the Hub, from a PVC, or a path in the image (s3:// is not served by the runtime).
ADAPTER_SOURCE = rf"^(?:{HF_SOURCE}|{PVC_SOURCE}|{IMAGE_SOURCE})$"
ADAPTER_SOURCE_MESSAGE = (
    f"adapter source must be hf://org/name[@revision], pvc://claim/path, or an absolute path, {SOURCE_PATH_RULES}"
)
ADAPTER_SYSTEM_PATH_MESSAGE = (
    "adapter source must not be a path under /proc, /sys, /dev, /etc, /run, /var/run, /var/lib/kubelet or /boot"
)
ADAPTER_CLAIM_TOO_LONG_MESSAGE = "adapter source's pvc:// claim name must be at most 253 characters"
# The name clients send for an adapter, and the second half of an AIFeature target `<aimodel>:<adapter>`.
ADAPTER_NAME = r"^[a-z0-9]([-a-z0-9._]*[a-z0-9])?$"


class Adapter(CelValidated):
    """A LoRA adapter served on top of the AIModel's weights, under its own model name."""

    cel_rules = (
        CelRule(
            f"self.source.matches(r'{ADAPTER_SOURCE}')",
            ADAPTER_SOURCE_MESSAGE,
            lambda adapter: re.fullmatch(ADAPTER_SOURCE, adapter.source) is not None,
        ),
        CelRule(
            f"!self.source.matches(r'{SYSTEM_PATH}')",
            ADAPTER_SYSTEM_PATH_MESSAGE,
            lambda adapter: re.fullmatch(SYSTEM_PATH, adapter.source) is None,
        ),
        CelRule(
            f"!self.source.matches(r'{CLAIM_TOO_LONG}')",
            ADAPTER_CLAIM_TOO_LONG_MESSAGE,
            lambda adapter: re.fullmatch(CLAIM_TOO_LONG, adapter.source) is None,
        ),
    )

    name: str = Field(
        pattern=ADAPTER_NAME,
        max_length=63,
        description="The model name clients send to use this adapter; an AIFeature targets it as '<aimodel>:<name>'.",
    )
    source: str = Field(
        max_length=1024,
        description="Where the adapter's files (adapter_config.json, adapter_model.safetensors) are: "
        "hf://org/name[@revision], pvc://claim/path, or an absolute path in the image.",
    )

    @property
    def pvc_claim(self) -> str | None:
        match = re.match(r"^pvc://([^/]+)", self.source)
        return match.group(1) if match else None
