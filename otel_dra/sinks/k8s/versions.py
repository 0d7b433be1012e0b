"""The DeviceTaintRule API versions and their first servers: imported by the renderer and by the
CLI's options (which must not import the renderer, so ``otel-dra --help`` stays fast)."""

from __future__ import annotations

from collections.abc import Mapping

#: ``--api-version`` choices, newest first: DeviceTaintRule is served as v1 (GA, on by default from
#: Kubernetes 1.37), v1beta2 (from 1.36, off by default there: the DRADeviceTaintRules feature gate and
#: the API version must be enabled) and v1alpha3 (from 1.33, alpha: the DRADeviceTaints feature gate and
#: the alpha API; the only version before 1.36). All three have the same fields (a taint and a
#: driver/pool/device selector).
API_VERSIONS: Mapping[str, str] = {
    "v1": "resource.k8s.io/v1",
    "v1beta2": "resource.k8s.io/v1beta2",
    "v1alpha3": "resource.k8s.io/v1alpha3",
}
DEFAULT_API_VERSION = "v1"
#: ``--k8s-api-version auto``: the newest version the cluster serves (:func:`otel_dra.sinks.k8s.apply.discover`).
AUTO_API_VERSION = "auto"
#: The first Kubernetes (major, minor) that serves each API version.
SERVED_FROM: Mapping[str, tuple[int, int]] = {
    "resource.k8s.io/v1": (1, 37),
    "resource.k8s.io/v1beta2": (1, 36),
    "resource.k8s.io/v1alpha3": (1, 33),
}


def newest_served(kubernetes: tuple[int, int]) -> str | None:
    """The newest ``--api-version`` choice a Kubernetes (major, minor) serves (``(1, 34)``: ``v1alpha3``),
    so ``--kubernetes-version 1.34`` alone renders what that server takes; ``None`` before 1.33."""
    return next((short for short, full in API_VERSIONS.items() if SERVED_FROM[full] <= kubernetes), None)
