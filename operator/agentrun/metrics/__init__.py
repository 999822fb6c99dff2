"""Prometheus metrics on an injected registry: definitions.py (and quota_metrics.py) define them and the
methods that change them, observing.py feeds them from one run's loop events, serving.py serves them."""
