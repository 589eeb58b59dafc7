"""The daemon's outward face: Prometheus metrics and the HTTP endpoints. Reads the latest view only."""
