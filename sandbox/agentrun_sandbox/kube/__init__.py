"""A Kubernetes API emulator: kmock plus the semantics of kube-apiserver a real operator relies on."""

from agentrun_sandbox.kube.emulator import KubeEmulator
from agentrun_sandbox.kube.http import ApiError, RequestRecord
from agentrun_sandbox.kube.server import EmulatedCluster, write_kubeconfig

__all__ = ["ApiError", "EmulatedCluster", "KubeEmulator", "RequestRecord", "write_kubeconfig"]
