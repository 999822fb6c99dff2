"""The pure agent loop: no Kubernetes, no SDK, no Prometheus; it talks through small Protocols."""
