"""Kopf handlers and the services behind them; their Kubernetes calls go through agentrun.kube."""
