"""What the pod API accepts as a label key, a label value, a DNS subdomain and label, as patterns for the schemas.

Checked when the AIModel is written rather than when its Deployment is refused (which the operator reports as
ChildRejected). A label key is an optional DNS-subdomain prefix and '/', then a name. The name part is at most 63
characters (in the pattern); the prefix at most 253 (LABEL_KEY_PREFIX, a second pattern: one regular expression
cannot bound both its length and its dots).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TypeVar

from pydantic import BaseModel

from servlane_api.cel import CelRule

LABEL_KEY = (
    "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"  # the prefix
    "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"  # the name
)
LABEL_KEY_MAX = 317  # a prefix of 253, '/', a name of 63
LABEL_KEY_PREFIX = "^([^/]{1,253}/)?[^/]*$"
LABEL_VALUE = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
DNS_SUBDOMAIN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL_1123 = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a namespace's name (a digit may come first)

# How a label key is written, for messages.
LABEL_KEY_SHAPE = (
    "(an optional DNS prefix of at most 253 characters and '/', then at most 63 letters, digits, '-', '_' or '.', "
    "beginning and ending with a letter or digit)"
)

M = TypeVar("M", bound=BaseModel)


def label_keys_hold(keys: Iterable[str]) -> bool:
    """Every key is a label key, its prefix included."""
    return all(
        len(key) <= LABEL_KEY_MAX and re.fullmatch(LABEL_KEY, key) and re.fullmatch(LABEL_KEY_PREFIX, key)
        for key in keys
    )


def label_keys_rule(
    keys_cel: str, words: str, keys: Callable[[M], Iterable[str]], *, unless_unset: str | None = None
) -> CelRule[M]:
    """A rule that the keys in `keys_cel` (a CEL list or map, e.g. self.nodeSelector or [self.key]) are label
    keys, checked only when the optional field `unless_unset` is set; `words` opens its message."""
    each = f"k.size() <= {LABEL_KEY_MAX} && k.matches('{LABEL_KEY}') && k.matches('{LABEL_KEY_PREFIX}')"
    every = f"{keys_cel}.all(k, {each})"
    return CelRule(
        f"!has(self.{unless_unset}) || {every}" if unless_unset else every,
        f"{words} {LABEL_KEY_SHAPE}",
        lambda obj: label_keys_hold(keys(obj)),
    )
