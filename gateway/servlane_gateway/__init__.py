"""Servlane's gateway: the OpenAI-compatible entry point that routes by AIFeature weights."""
