"""Where and how an s3:// source is fetched: the AIModel's `source.s3` and the runtime's `RuntimeConfig.s3`.

Any S3-compatible store: AWS by default, or another at `endpoint` (SeaweedFS, MinIO, Ceph RGW, R2, ...).
Credentials are never here: they come from `source.credentialsSecret` as AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) in the pod's environment.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from servlane_api._base import ApiModel

# http(s)://host[:port]: a DNS name or an IPv4 or bracketed IPv6 address, and nothing else: no user:password@
# (credentials belong in the Secret), no path, query or fragment.
_HOST_LABEL = r"[A-Za-z0-9](?:[-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
S3_ENDPOINT = rf"^https?://(?:{_HOST_LABEL}(?:\.{_HOST_LABEL})*|\[[0-9A-Fa-f:.]{{2,45}}\])(?::[0-9]{{1,5}})?$"
# AWS's region names (us-east-1, eu-central-2, ...), and the lowercase names other stores use.
S3_REGION = r"^[a-z0-9](?:[-a-z0-9_]{0,62}[a-z0-9])?$"
# A transfer that delivers no byte for this long fails the start with a named error (a hung store or network
# would otherwise hold the pod until the load timeout, 30 minutes by default).
DEFAULT_STALL_TIMEOUT_SECONDS = 60
MAX_STALL_TIMEOUT_SECONDS = 3600


class S3Options(ApiModel):
    """How to reach the store of an s3:// source (AIModel `spec.source.s3`)."""

    endpoint: str | None = Field(
        default=None,
        pattern=S3_ENDPOINT,
        max_length=300,
        description="The store's URL, http(s)://host[:port] (no path, no credentials), for an S3-compatible "
        "store other than AWS (SeaweedFS, MinIO, Ceph, R2, ...). Default: AWS S3.",
    )
    region: str | None = Field(
        default=None,
        pattern=S3_REGION,
        max_length=64,
        description="The bucket's region (e.g. eu-west-1). Default: asked of the store (GetBucketLocation), "
        "which needs that permission.",
    )
    path_style: bool | None = Field(
        default=None,
        description="true: path-style requests (endpoint/bucket/key), which most self-hosted stores need; false: "
        "virtual-hosted style (bucket.endpoint/key). Default: virtual-hosted on AWS, path-style elsewhere.",
    )
    stall_timeout_seconds: int = Field(
        default=DEFAULT_STALL_TIMEOUT_SECONDS,
        ge=1,
        le=MAX_STALL_TIMEOUT_SECONDS,
        description="A transfer that receives no byte for this long fails the start (ModelSourceFailed), "
        "instead of hanging until the load timeout.",
    )

    def settings(self) -> S3Settings:
        return S3Settings(
            endpoint=self.endpoint,
            region=self.region,
            path_style=self.path_style,
            stall_timeout_seconds=self.stall_timeout_seconds,
        )


class S3Settings(BaseModel):
    """The same, as the runtime reads it (`RuntimeConfig.s3`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str | None = Field(default=None, pattern=S3_ENDPOINT)
    region: str | None = Field(default=None, pattern=S3_REGION)
    path_style: bool | None = None
    stall_timeout_seconds: float = Field(default=DEFAULT_STALL_TIMEOUT_SECONDS, gt=0)
