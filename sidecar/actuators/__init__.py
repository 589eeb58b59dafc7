"""Adapters that restart vLLM (systemd, Kubernetes, exec, none). Thin, idempotent, dry-run aware. I/O."""
