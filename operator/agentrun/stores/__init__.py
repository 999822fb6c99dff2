"""Transcript stores beyond the Kubernetes API: I/O modules only (the loop and the API never import them)."""
