"""API objects shared by the console tests (no tests here): a feature in the middle of a canary (with its
analyses), its models."""

from __future__ import annotations
