"""Servlane's operator: reconciles AIModel and AIFeature resources (kopf)."""
