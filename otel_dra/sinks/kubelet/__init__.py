"""The kubelet side of DRA device health: the ``DRAResourceHealth`` stream and plugin registration.

- :class:`KubeletHealthServer` streams every device's verdict to the kubelet (KEP-4680), which puts it
  in ``pod.status.containerStatuses[].allocatedResourcesStatus``;
- :class:`RegistrationServer` optionally announces that socket to the kubelet's plugin watcher.
"""

from otel_dra.sinks.config import KUBELET_DEFAULT_TIMEOUT_S, default_endpoint
from otel_dra.sinks.kubelet._socket import KubeletSocketError
from otel_dra.sinks.kubelet.registration import (
    DEFAULT_REGISTRY_DIR,
    RegistrationServer,
    registration_socket,
)
from otel_dra.sinks.kubelet.server import (
    HEALTH_SERVICES,
    MAX_MESSAGE,
    MAX_RESEND_S,
    UNIDENTIFIED_DEVICES,
    WATCHERS,
    KubeletHealthServer,
    build_response,
    device_message,
    truncate_message,
)

__all__ = [
    "DEFAULT_REGISTRY_DIR",
    "HEALTH_SERVICES",
    "KUBELET_DEFAULT_TIMEOUT_S",
    "MAX_MESSAGE",
    "MAX_RESEND_S",
    "UNIDENTIFIED_DEVICES",
    "WATCHERS",
    "KubeletHealthServer",
    "KubeletSocketError",
    "RegistrationServer",
    "build_response",
    "default_endpoint",
    "device_message",
    "registration_socket",
    "truncate_message",
]
