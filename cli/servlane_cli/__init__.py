"""Standalone mode: the same AIModel/AIFeature manifests served on one machine, without Kubernetes."""
