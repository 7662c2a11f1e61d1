"""Servlane's shared pure logic: what the operator, runtime, gateway and CLI decide alike.

- `rollout`: the canary state machine, GPU budgets and analysis (no I/O, no clock).
- `routing`: how a request for a feature picks an AIModel (route table, weighted sticky picking,
  feature defaults, endpoint overrides).
- `protocol`: the OpenAI wire protocol (pydantic models) and its one error shape.

Nothing here talks to the network or Kubernetes; everything here may import only `servlane_api`.
"""
