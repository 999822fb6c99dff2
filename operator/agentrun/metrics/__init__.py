"""Prometheus metrics: one observer of loop events, with an injected registry."""
