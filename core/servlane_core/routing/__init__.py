"""Routing rules: from AIFeatures and AIModels to the backend that answers a request. Pure."""
