"""Whether Kopf may scan the cluster, asked before it starts: one SelfSubjectAccessReview per right.

Kopf lists and watches CustomResourceDefinitions (to serve a CRD installed later) and, when it serves
named namespaces, Namespaces too (to match patterns and notice namespaces created later). Without the
right it retries each 403 for about 54 s (its error backoffs), logging every attempt, before it falls
back; meanwhile no run is served. With exact namespace names neither scan is needed, so when a right is
missing the operator says so in one line and tells Kopf not to scan (``settings.scanning.disabled``);
with a namespace pattern the scan is needed, so it stops at once with one line naming the right.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from agentrun.kube.calling import KubeClient
from agentrun.kube.errors import APIError
from agentrun.kube.failures import KubeFailure

logger = logging.getLogger(__name__)

#: (verb, resource, API group) Kopf's scans need, cluster-wide.
CRD_RIGHTS = (
    ("list", "customresourcedefinitions", "apiextensions.k8s.io"),
    ("watch", "customresourcedefinitions", "apiextensions.k8s.io"),
)
NAMESPACE_RIGHTS = (("list", "namespaces", ""), ("watch", "namespaces", ""))


def is_pattern(namespace: str) -> bool:
    """A Kopf namespace pattern (glob, negation or list) rather than one namespace's name."""
    return any(c in namespace for c in "*?[!,")


async def kopf_may_scan(kube: KubeClient, namespaces: Sequence[str]) -> bool:
    """True when Kopf has the rights to scan; False (after one line in the log) when it must not try.

    Raises KubeFailure when a namespace pattern needs a scan the identity may not make.
    """
    wanted = CRD_RIGHTS + (NAMESPACE_RIGHTS if namespaces else ())
    missing: list[tuple[str, str, str]] = []
    try:
        for verb, resource, group in wanted:
            if not await kube.may(verb, resource, group=group):
                missing.append((verb, resource, group))
    except APIError as exc:  # the review itself refused or unknown: let Kopf find out as before
        logger.debug("could not ask which rights Kopf's scans have: %s", exc)
        return True
    if not missing:
        return True
    rights = _describe(missing)
    patterns = [ns for ns in namespaces if is_pattern(ns)]
    if patterns:
        raise KubeFailure(
            f"cannot serve namespaces matching {', '.join(patterns)}: this identity may not {rights} "
            "(cluster-wide), which matching namespace patterns needs; grant it (the chart's "
            "rbac.scope: namespaces does) or name the namespaces exactly"
        )
    served = f"serves {', '.join(namespaces)} as named" if namespaces else "serves all namespaces"
    logger.info(
        "this identity may not %s (cluster-wide): the operator %s without scanning the cluster; "
        "a CRD installed from now on is served after a restart",
        rights,
        served,
    )
    return False


def _describe(missing: Sequence[tuple[str, str, str]]) -> str:
    """ "list and watch namespaces, watch customresourcedefinitions.apiextensions.k8s.io"."""
    by_resource: dict[str, list[str]] = {}
    for verb, resource, group in missing:
        by_resource.setdefault(f"{resource}.{group}" if group else resource, []).append(verb)
    return ", ".join(f"{' and '.join(verbs)} {resource}" for resource, verbs in by_resource.items())
