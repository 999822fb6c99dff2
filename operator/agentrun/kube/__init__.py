"""The one Kubernetes client layer: where the cluster is, one call point, typed errors, one retry policy.

Only this package imports kubernetes_asyncio (an import contract says so); Kopf keeps its own client.
"""
