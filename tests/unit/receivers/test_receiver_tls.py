"""TLS for the fleet's OTLP receiver, and for the agent's push into it: real certificates (a CA made
by trustme for the test), real gRPC and HTTP on loopback, the SDK's exporters reading the standard
``OTEL_EXPORTER_OTLP_*CERTIFICATE`` variables; then both real processes, agent and fleet, over TLS."""

from __future__ import annotations

import itertools
import json
import logging
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
import trustme
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import MetricsServiceStub
from opentelemetry.sdk.metrics.export import MetricExportResult

from otel_dra.cli.flags import FLAGS
from otel_dra.receivers import OtlpReceiver
from otel_dra.receivers.tls import RELOAD_CHECK_S, TlsConfigError, TlsSettings
from otel_dra.sinks import provider
from tests.conftest import REPO, Inbox, http_get, spawn_fleet, wait_for
from tests.unit.receivers.test_receiver_otlp import T0, Agent

S = 10**9
#: The nodes the tests' client certificate reports for.
CLIENT_NODES = ("node-tls", "node-rotate", "node-g", "node-h")


class Pki:
    """A CA, a server certificate for 127.0.0.1/localhost, and a client certificate, as PEM files."""

    def __init__(self, where: Path) -> None:
        self.ca = trustme.CA()
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        # With mutual TLS a certificate speaks only for the nodes it names (issue #16): these tests' nodes.
        client = self.ca.issue_cert("node-agent.example", *CLIENT_NODES)
        self.ca_file = where / "ca.pem"
        self.cert_file, self.key_file = where / "server.pem", where / "server.key"
        self.client_cert_file, self.client_key_file = where / "client.pem", where / "client.key"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        server.private_key_pem.write_to_path(str(self.key_file))
        self.cert_file.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
        client.private_key_pem.write_to_path(str(self.client_key_file))
        self.client_cert_file.write_bytes(b"".join(blob.bytes() for blob in client.cert_chain_pems))

    def settings(self, mutual: bool = False) -> TlsSettings:
        tls = TlsSettings.load(str(self.cert_file), str(self.key_file), str(self.ca_file) if mutual else None)
        assert tls is not None
        return tls

    def exporter_env(self, client: bool = False) -> dict[str, str]:
        env = {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(self.ca_file)}
        if client:
            env |= {
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(self.client_cert_file),
                "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(self.client_key_file),
            }
        return env


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_receiver(pki, start_receiver):
    def start(mutual: bool = False) -> tuple[OtlpReceiver, Inbox]:
        return start_receiver(tls=pki.settings(mutual))

    return start


def nodes_in(inbox: Inbox) -> set[str]:
    return {f.devices.node for f in inbox.frames()}


def push(monkeypatch, pki: Pki, env: dict[str, str], endpoint: str, protocol: str) -> MetricExportResult:
    """One export of an agent pipeline's metrics through the SDK exporter the agent uses, on a machine
    whose REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE name another CA: the OTEL_ certificate must still win."""
    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(key)
    unrelated = pki.ca_file.parent / "unrelated-ca.pem"
    if not unrelated.exists():
        trustme.CA().cert_pem.write_to_path(str(unrelated))
    for key, value in {"REQUESTS_CA_BUNDLE": str(unrelated), "CURL_CA_BUNDLE": str(unrelated), **env}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "3")
    agent = Agent("node-tls", devices=2)
    try:
        _, data = agent.sample(T0)
        exporter = provider.otlp_exporter(endpoint, protocol)
        try:
            return exporter.export(data)
        finally:
            exporter.shutdown()
    finally:
        agent.close()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_sdk_exporter_pushes_over_tls_with_the_standard_variables(monkeypatch, pki, tls_receiver, protocol):
    receiver, inbox = tls_receiver()
    port = receiver.grpc_port if protocol == "grpc" else receiver.http_port
    ok = MetricExportResult.SUCCESS
    assert push(monkeypatch, pki, pki.exporter_env(), f"https://127.0.0.1:{port}", protocol) is ok
    assert nodes_in(inbox) == {"node-tls"}
    # Plaintext to the TLS port is refused; so is a client that does not trust the server's CA.
    assert push(monkeypatch, pki, {}, f"http://127.0.0.1:{port}", protocol) is MetricExportResult.FAILURE
    other_ca = pki.ca_file.parent / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    env = {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(other_ca)}
    assert push(monkeypatch, pki, env, f"https://127.0.0.1:{port}", protocol) is MetricExportResult.FAILURE
    # The receiver kept serving through all of it.
    before = len(inbox.frames())
    assert push(monkeypatch, pki, pki.exporter_env(), f"https://127.0.0.1:{port}", protocol) is ok
    assert len(inbox.frames()) > before


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_mutual_tls_refuses_clients_without_a_certificate(monkeypatch, pki, tls_receiver, protocol):
    receiver, inbox = tls_receiver(mutual=True)
    port = receiver.grpc_port if protocol == "grpc" else receiver.http_port
    url = f"https://127.0.0.1:{port}"
    assert push(monkeypatch, pki, pki.exporter_env(client=False), url, protocol) is MetricExportResult.FAILURE
    assert not inbox.frames()
    assert push(monkeypatch, pki, pki.exporter_env(client=True), url, protocol) is MetricExportResult.SUCCESS
    assert nodes_in(inbox) == {"node-tls"}


_EXPORTS = itertools.count(1)  # each export a second after the last: the receiver keeps each node's newest time


def export_trusting(
    ca_file: Path, receiver: OtlpReceiver, protocol: str, client: Pki | None = None, node: str = "node-rotate"
) -> bool:
    """One export to the receiver from a client that trusts only ``ca_file`` (and shows ``client``'s
    certificate, if given): did it go through? Raw gRPC and HTTPS clients, without the SDK, each a
    new connection (so each is a new handshake)."""
    agent = Agent(node, devices=1)
    _, data = agent.sample(T0 + next(_EXPORTS) * S)
    agent.close()
    request = encode_metrics(data)
    try:
        if protocol == "grpc":
            key, chain = (
                (client.client_key_file.read_bytes(), client.client_cert_file.read_bytes()) if client else (None, None)
            )
            creds = grpc.ssl_channel_credentials(ca_file.read_bytes(), key, chain)
            with grpc.secure_channel(f"127.0.0.1:{receiver.grpc_port}", creds) as channel:
                MetricsServiceStub(channel).Export(request, timeout=5)
            return True
        ctx = ssl.create_default_context(cafile=str(ca_file))
        if client is not None:
            ctx.load_cert_chain(str(client.client_cert_file), str(client.client_key_file))
        req = urllib.request.Request(
            f"https://127.0.0.1:{receiver.http_port}/v1/metrics",
            data=request.SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
        )
        with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
            return resp.status == 200
    except (grpc.RpcError, urllib.error.URLError, ssl.SSLError, ConnectionError):
        return False


def test_a_raw_grpc_client_and_a_stalled_https_client(pki, tls_receiver):
    """The same server seen without the SDK: gRPC with ssl_channel_credentials works; a TCP client that
    opens the HTTPS port and never speaks holds one thread, not the receiver."""
    receiver, inbox = tls_receiver()
    stalled = __import__("socket").create_connection(("127.0.0.1", receiver.http_port))
    try:
        assert export_trusting(pki.ca_file, receiver, "grpc", node="node-raw")
        assert export_trusting(pki.ca_file, receiver, "http/protobuf", node="node-raw")
        assert nodes_in(inbox) == {"node-raw"} and len(inbox.frames()) == 2
    finally:
        stalled.close()


def two_cas(tmp_path: Path) -> tuple[Pki, Pki]:
    """Two independent PKIs (CA, server and client certificates), in folders of their own."""
    pkis = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        pkis.append(Pki(tmp_path / name))
    return pkis[0], pkis[1]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_renewed_certificate_reaches_new_connections_without_a_restart(tmp_path, start_receiver, caplog, protocol):
    """cert-manager renews the certificate in place: new connections get the new one (here from another
    CA, so each client can tell which one it was served); a broken renewal keeps the last good one."""
    old, new = two_cas(tmp_path)
    live = tmp_path / "live"
    live.mkdir()

    def install(pki: Pki) -> None:
        for name in ("server.pem", "server.key"):
            (live / name).write_bytes((pki.cert_file.parent / name).read_bytes())

    install(old)
    settings = TlsSettings.load(str(live / "server.pem"), str(live / "server.key"))
    assert settings is not None
    caplog.set_level(logging.INFO, logger="otel_dra.receivers.tls")
    receiver, inbox = start_receiver(tls=settings)
    assert export_trusting(old.ca_file, receiver, protocol)
    assert not export_trusting(new.ca_file, receiver, protocol)
    install(new)
    wait_for(lambda: export_trusting(new.ca_file, receiver, protocol), 10, "the renewed certificate")
    assert not export_trusting(old.ca_file, receiver, protocol)
    assert "new connections get the certificate" in caplog.text
    # A renewal that breaks the files: logged, and the last good certificate is still served.
    (live / "server.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\ntruncated")
    time.sleep(RELOAD_CHECK_S * 1.5)
    assert export_trusting(new.ca_file, receiver, protocol)
    assert "cannot be used" in caplog.text and "still serving the previous certificate" in caplog.text
    assert nodes_in(inbox) == {"node-rotate"}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_rotated_client_ca_applies_to_new_connections(tmp_path, start_receiver, protocol):
    """Mutual TLS with the agents' CA rotated in place: clients with a certificate from the new CA
    get in, those from the old one no longer do; the server's own certificate stays."""
    old, new = two_cas(tmp_path)
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(old.ca_file.read_bytes())
    settings = TlsSettings.load(str(old.cert_file), str(old.key_file), str(client_ca))
    receiver, _ = start_receiver(tls=settings)
    assert export_trusting(old.ca_file, receiver, protocol, client=old)
    assert not export_trusting(old.ca_file, receiver, protocol, client=new)
    client_ca.write_bytes(new.ca_file.read_bytes())
    wait_for(lambda: export_trusting(old.ca_file, receiver, protocol, client=new), 10, "the new client CA")
    assert not export_trusting(old.ca_file, receiver, protocol, client=old)
    assert not export_trusting(old.ca_file, receiver, protocol)  # and still no client certificate, no entry


def test_bad_tls_files_are_one_line_errors_naming_the_flag(pki, tmp_path):
    def error(*args) -> str:
        with pytest.raises(TlsConfigError) as err:
            TlsSettings.load(*args)
        assert "\n" not in str(err.value) and "--tls" not in str(err.value)  # the config names fields...
        return err.value.named(FLAGS)  # ... and the command line's one table the flags

    cert, key, ca = str(pki.cert_file), str(pki.key_file), str(pki.ca_file)
    assert TlsSettings.load(None, None) is None
    assert "--tls-key-file is missing" in error(cert, None)
    assert "--tls-cert-file is missing" in error(None, key)
    assert "--tls-client-ca-file needs" in error(None, None, ca)
    assert "No such file" in error(str(tmp_path / "nope.pem"), key) and "--tls-cert-file" in error(
        str(tmp_path / "nope.pem"), key
    )
    (tmp_path / "junk.pem").write_text("hello")
    assert "not a PEM file" in error(str(tmp_path / "junk.pem"), key)
    other = trustme.CA().issue_cert("127.0.0.1")
    other.private_key_pem.write_to_path(str(tmp_path / "other.key"))
    assert "private key that belongs to it" in error(cert, str(tmp_path / "other.key"))
    assert "--tls-client-ca-file" in error(cert, key, str(tmp_path / "junk.pem"))


def test_fleet_cli_with_bad_tls_files_is_exit_2_before_binding(tmp_path):
    missing = str(tmp_path / "missing.pem")
    proc = subprocess.run(
        [sys.executable, "-m", "otel_dra", "fleet", "--tls-cert-file", missing, "--tls-key-file", missing],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "--tls-cert-file" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.e2e
def test_agents_push_to_the_fleet_over_mutual_tls_on_both_transports(pki, tmp_path, start_agent):
    """`otel-dra fleet --tls-*` and two `otel-dra run` agents pushing to it over https (one per transport)
    with the standard OTEL_EXPORTER_OTLP_* certificate variables: every device arrives; an agent
    without a client certificate gets nothing in, and the fleet keeps serving."""
    fleet = spawn_fleet(
        tmp_path,
        env={
            "OTEL_DRA_TLS_CERT_FILE": str(pki.cert_file),
            "OTEL_DRA_TLS_KEY_FILE": str(pki.key_file),
            "OTEL_DRA_TLS_CLIENT_CA_FILE": str(pki.ca_file),
        },
    )
    agents = []

    def agent(node: str, protocol: str, transport: str, client: bool) -> None:
        env = {**pki.exporter_env(client=client), "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
        endpoint = f"https://127.0.0.1:{fleet.ports[transport]}"
        args = ("--interval", "1", "--node-name", node, "--otlp-protocol", protocol, "--otlp-endpoint", endpoint)
        agents.append(start_agent(*args, env=env, wait=False))

    try:
        agent("node-g", "grpc", "grpc", client=True)
        agent("node-h", "http/protobuf", "http", client=True)
        agent("node-x", "grpc", "grpc", client=False)

        def nodes() -> dict[str, int]:
            counts: dict[str, int] = {}
            for d in json.loads(http_get(fleet.url + "/v1/devices")[1])["devices"]:
                counts[d["k8s.node.name"]] = counts.get(d["k8s.node.name"], 0) + 1
            return counts

        wait_for(lambda: nodes() == {"node-g": 8, "node-h": 8}, 60, "both TLS agents' devices at the fleet")
        time.sleep(3)
        assert nodes() == {"node-g": 8, "node-h": 8}, "the agent without a client certificate got in"
        assert "TLS with client certificates" in fleet.log.read_text()
        assert all(a.proc.poll() is None for a in agents) and fleet.proc.poll() is None
    finally:
        fleet.stop()
    assert "Traceback" not in fleet.log.read_text()


def test_http_error_pages_of_the_tls_endpoint_say_where_to_go(pki, tls_receiver):
    receiver, _ = tls_receiver()
    ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    try:
        urllib.request.urlopen(f"https://127.0.0.1:{receiver.http_port}/", context=ctx, timeout=5)
    except urllib.error.HTTPError as err:
        assert err.code == 405
    else:
        pytest.fail("GET / should be refused")
