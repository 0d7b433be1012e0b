"""Kubelet plugin registration (pluginwatcher): ``Registration`` on ``<registry_dir>/<driver>-reg.sock``.

The kubelet watches ``/var/lib/kubelet/plugins_registry`` for sockets, calls ``GetInfo`` on each, and
for type ``DRAPlugin`` validates ``supported_versions`` as the list of gRPC services the plugin serves
at ``endpoint`` ("<proto package>.<service>"); it then reports the outcome with
``NotifyRegistrationStatus``. Kubelet head picks the health stream's version from that list
(``v1.DRAResourceHealth`` preferred, ``v1alpha1.DRAResourceHealth`` accepted during the transition);
older kubelets call ``v1alpha1`` on every DRA plugin. So the default advertises exactly the health
services :class:`~otel_dra.sinks.kubelet.server.KubeletHealthServer` serves, and nothing it doesn't.

Caveat, from the kubelet's DRA plugin manager (1.34+): it accepts a DRA registration only when the list
also names a ``DRAPlugin`` service (``v1.DRAPlugin`` / ``v1beta1.DRAPlugin``: NodePrepareResources),
refusing any other with "none of services supported by the plugin [...] are supported by the kubelet",
and it sends a driver's prepare calls to its newest connected plugin. This server refuses to advertise
``DRAPlugin`` (it doesn't serve it, and claiming it would steal the real driver's prepare calls), so a
real kubelet always refuses otel-dra's own registration and the refusal is logged. Registration is only
for a driver built on otel-dra whose endpoint also serves DRAPlugin; otherwise the node's DRA driver
reads the health socket and relays it (deploy/README.md, "Relaying health to the kubelet").
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc

from otel_dra.sinks.config import KUBELET_PLUGIN_REGISTRY
from otel_dra.sinks.kubelet import _socket
from otel_dra.sinks.kubelet.api import pluginregistration_v1_pb2 as reg_pb
from otel_dra.sinks.kubelet.server import HEALTH_SERVICES

log = logging.getLogger(__name__)

SERVICE = "pluginregistration.Registration"
DRA_PLUGIN_TYPE = "DRAPlugin"
DEFAULT_REGISTRY_DIR = KUBELET_PLUGIN_REGISTRY

# A DRA driver name: a DNS subdomain of at most 63 characters (the kubelet rejects anything else).
_DRIVER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def registration_socket(registry_dir: str, driver_name: str) -> str:
    """``<registry_dir>/<driver>-reg.sock`` (the pluginwatcher's naming convention)."""
    return os.path.join(registry_dir, f"{driver_name}-reg.sock")


class RegistrationServer:
    """Answers the kubelet's ``GetInfo`` for one DRA driver and logs its verdict on the registration."""

    def __init__(
        self,
        registry_dir: str,
        driver_name: str,
        endpoint: str,
        versions: Sequence[str] = HEALTH_SERVICES,
    ) -> None:
        if len(driver_name) > 63 or not _DRIVER_NAME.match(driver_name):
            raise ValueError(f"driver name {driver_name!r} is not a DNS subdomain of at most 63 characters")
        if not os.path.isabs(endpoint):
            raise ValueError(f"endpoint {endpoint!r} must be an absolute socket path")
        versions = list(versions)
        if not versions:
            raise ValueError("versions must name at least one service")
        claimed = [v for v in versions if v.endswith(".DRAPlugin")]
        if claimed:
            raise ValueError(
                f"refusing to advertise {', '.join(claimed)}: this plugin does not serve NodePrepareResources, "
                "and the kubelet would route the driver's prepare calls to it"
            )
        self.registry_dir = registry_dir
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.versions = versions
        self.socket_path = registration_socket(registry_dir, driver_name)
        #: The kubelet's last word: (registered, error), or None before it spoke.
        self.status: tuple[bool, str] | None = None
        self.notified = threading.Event()
        self._server: grpc.Server | None = None
        self._socket_id: tuple[int, int] | None = None

    def start(self) -> None:
        """Listen on the registration socket (0600, directory created; a stale socket is replaced)."""
        if self._server is not None:
            raise RuntimeError("RegistrationServer already started")
        handlers = {
            "GetInfo": grpc.unary_unary_rpc_method_handler(
                self._get_info,
                request_deserializer=reg_pb.InfoRequest.FromString,
                response_serializer=reg_pb.PluginInfo.SerializeToString,
            ),
            "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                self._notify,
                request_deserializer=reg_pb.RegistrationStatus.FromString,
                response_serializer=reg_pb.RegistrationStatusResponse.SerializeToString,
            ),
        }
        server = grpc.server(
            ThreadPoolExecutor(2, thread_name_prefix="kubelet-registration"),
            handlers=[grpc.method_handlers_generic_handler(SERVICE, handlers)],
        )
        self._socket_id = _socket.serve_on(server, self.socket_path, log.warning)
        self._server = server
        log.info(
            "registering DRA plugin %s with the kubelet via %s: endpoint %s, services %s",
            self.driver_name,
            self.socket_path,
            self.endpoint,
            ",".join(self.versions),
        )

    def shutdown(self, timeout_s: float = 1.0) -> None:
        """Stop answering and remove the socket (the kubelet then deregisters the plugin)."""
        grace_s = timeout_s / 2  # half for work in flight, the rest for closing
        server = self._server
        if server is None:
            return
        server.stop(grace_s).wait(grace_s + 1.0)
        _socket.remove_if_ours(self.socket_path, self._socket_id)
        self._server = self._socket_id = None

    def plugin_info(self) -> reg_pb.PluginInfo:
        """What ``GetInfo`` answers."""
        return reg_pb.PluginInfo(
            type=DRA_PLUGIN_TYPE, name=self.driver_name, endpoint=self.endpoint, supported_versions=self.versions
        )

    def _get_info(self, request: reg_pb.InfoRequest, context: grpc.ServicerContext) -> reg_pb.PluginInfo:
        return self.plugin_info()

    def _notify(
        self, request: reg_pb.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb.RegistrationStatusResponse:
        self.status = (request.plugin_registered, request.error)
        if request.plugin_registered:
            log.info("kubelet registered DRA plugin %s (health endpoint %s)", self.driver_name, self.endpoint)
        else:
            hint = ""
            if "DRAPlugin" in request.error or "none of services" in request.error:
                hint = (
                    " (this kubelet accepts a DRA plugin only if it also serves v1.DRAPlugin or v1beta1.DRAPlugin:"
                    " serve the health stream from the driver's own plugin socket)"
                )
            log.error("kubelet rejected DRA plugin %s: %s%s", self.driver_name, request.error or "no reason", hint)
        self.notified.set()
        return reg_pb.RegistrationStatusResponse()
