"""What tests, e2e and bench share: harnesses (a gateway, a runtime, a local cluster), fixtures that build or
start real things (tiny models, S3, Jaeger, databases) and small helpers (free ports, polling, raw HTTP).

Test modules import from here and never from one another (`lint-imports .importlinter-tests`)."""
