"""Kopf handlers and the services behind them: the only layer that talks to Kubernetes."""
