"""Notifications of what the sidecar decided and did: webhook (JSON, Slack), Kubernetes Events, the log."""
