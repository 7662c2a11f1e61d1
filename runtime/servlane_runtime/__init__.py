"""Servlane's runtime: one OpenAI-compatible server with vLLM and transformers engines."""
