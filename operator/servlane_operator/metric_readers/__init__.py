"""Where canary metrics come from: Prometheus (`prometheus_reader`) or the gateway pods' /metrics
(`scrape_reader`). The only parts of the rollout that talk to the network; they fill
`servlane_core.rollout.window.WindowMetrics` for the pure state machine."""
