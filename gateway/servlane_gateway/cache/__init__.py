"""The response cache: its keys and rules, and the stores that keep answers (memory, Redis)."""
