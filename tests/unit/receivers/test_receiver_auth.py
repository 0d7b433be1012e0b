"""Who may speak for a node (issue #16): the bearer token, a client certificate that speaks only for
the node it names, the mapping file that lets a Collector forward for many, and the decoders' hook
that refuses a node's points before anything of them is kept. Real gRPC and HTTPS on loopback, with
certificates made by trustme (and one with a URI name, made with cryptography)."""

from __future__ import annotations

import datetime
import http.client
import logging
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from google.protobuf.json_format import MessageToJson
from google.rpc import code_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics.export import MetricExportResult

from otel_dra.decode import OtlpJsonDecoder
from otel_dra.decode.limits import FORBIDDEN_NODE, DecodeLimits
from otel_dra.decode.otlp_proto import OtlpProtoDecoder
from otel_dra.frame import Schema
from otel_dra.receivers.auth import (
    RELOAD_CHECK_S,
    AuthConfigError,
    ClientNodes,
    NodeGrants,
    ReceiverAuth,
    token_problem,
)
from otel_dra.receivers.tls import TlsSettings
from otel_dra.sinks import provider
from tests.conftest import wait_for
from tests.unit.receivers.test_receiver_otlp import EXPORT, T0, Agent, gauge, gpu, post, pt, raw_grpc, req, resource

S = 10**9
TOKEN = "s3cr3t-token-of-the-fleet"
COLLECTOR = "otel-collector.observability.svc"
SPIFFE = "spiffe://example.org/node/{node}"


# -- requests ----------------------------------------------------------------------------------------
def node_request(node: str, t: int, devices: int = 2) -> ExportMetricsServiceRequest:
    """What a node's agent pushes at ``t``: the simulator's devices through the SDK's encoder."""
    agent = Agent(node, devices=devices)
    try:
        _, data = agent.sample(t)
    finally:
        agent.close()
    return encode_metrics(data)


def forged(request: ExportMetricsServiceRequest, dt_s: float = 1.0) -> ExportMetricsServiceRequest:
    """The same request, later, with gpu-0's uncorrected-ECC counter raised by one (issue #16's attack)."""
    out = ExportMetricsServiceRequest()
    out.CopyFrom(request)
    raised = 0
    for rm in out.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                body = getattr(m, m.WhichOneof("data"))
                for p in body.data_points:
                    p.time_unix_nano += int(dt_s * S)
                    attrs = {kv.key: kv.value.string_value for kv in p.attributes}
                    if m.name == "hw.errors" and attrs.get("error.type") == "uncorrected" and attrs["hw.id"] == "gpu-0":
                        if p.WhichOneof("value") == "as_int":
                            p.as_int += 1
                        else:
                            p.as_double += 1.0
                        raised += 1
    assert raised == 1, "the request carries gpu-0's uncorrected ECC counter"
    return out


def points_of(request: ExportMetricsServiceRequest) -> int:
    return sum(
        len(getattr(m, m.WhichOneof("data")).data_points)
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )


def two_nodes(a: str, b: str, t: int) -> ExportMetricsServiceRequest:
    """One point of each node at ``t`` (the SDK stamps an agent's points with the wall clock: later ones
    than those of :func:`node_request` must be too)."""
    return req(resource(a, gauge("hw.power", pt(gpu(), 250.0, t))), resource(b, gauge("hw.power", pt(gpu(), 260.0, t))))


# -- the decoders' hook: no state before the speaker says yes ------------------------------------------------
def only(*nodes: str):
    return lambda node: node in nodes


@pytest.mark.parametrize("fast", [True, False])
def test_a_forbidden_nodes_points_are_refused_before_the_decoder_keeps_anything(fast):
    """The forged request, refused, leaves no trace: the node's honest request that follows, older than
    the forgery, is taken (a forgery taken would have raised the node's time floor past it)."""
    decoder = OtlpProtoDecoder(Schema(), fast=fast)
    honest = node_request("node-a", T0)
    for k in range(3):  # the fast path's template of node-a's section is made and used
        later = forged(honest, k) if k else honest
        assert decoder.decode(later.SerializeToString(), speaker=only("node-a")).rejected == 0
    assert decoder.sections_fast > 0 or not fast
    attack = forged(honest, 60)
    result = decoder.decode(attack.SerializeToString(), speaker=only("node-b"))
    assert result.frames == [] and result.rejected == result.points == points_of(attack)
    assert result.limited == {FORBIDDEN_NODE: result.points}
    assert "may not report for it" in result.message and "node-a" in result.message
    follow = decoder.decode(forged(honest, 10).SerializeToString(), speaker=only("node-a"))
    assert follow.rejected == 0 and follow.frames


def test_a_forbidden_node_takes_no_slot_and_the_json_decoder_asks_too():
    decoder = OtlpProtoDecoder(Schema(), limits=DecodeLimits(max_nodes=1))
    refused = decoder.decode(two_nodes("node-x", "node-y", T0).SerializeToString(), speaker=only("node-y"))
    assert refused.limited == {FORBIDDEN_NODE: 1} and {f.devices.node for f in refused.frames} == {"node-y"}
    assert decoder.decode(req(resource("node-z", gauge("hw.power", pt(gpu(), 1.0, T0)))).SerializeToString()).limited
    as_json = OtlpJsonDecoder(Schema(), max_future_ns=None)
    text = MessageToJson(two_nodes("node-a", "node-b", T0), indent=None)
    result = as_json.decode(text, 1, speaker=only("node-a"))
    assert result.limited == {FORBIDDEN_NODE: 1} and {f.devices.node for f in result.frames} == {"node-a"}
    assert as_json.decode(text.replace(str(T0), str(T0 + S)), 2).limited == {}  # no speaker: replay


# -- the bearer token ----------------------------------------------------------------------------------------
@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def test_a_token_file_and_its_checks(tmp_path, token_file):
    assert token_problem(f"Bearer {TOKEN}", [TOKEN.encode()]) is None
    assert token_problem(f"bearer  {TOKEN} ", [TOKEN.encode()]) is None  # the scheme has no case
    assert token_problem(None, [TOKEN.encode()]) == "no authorization header"
    assert token_problem(f"Basic {TOKEN}", [TOKEN.encode()]) == "not a Bearer token"
    assert token_problem("Bearer nope", [TOKEN.encode()]) == "a wrong token"
    assert token_problem("Bearer", [TOKEN.encode()]) == "a wrong token"
    two = tmp_path / "two"
    two.write_text(f"# rotating\n{TOKEN}\n\nnext-token\n")
    auth = ReceiverAuth(str(two))
    assert auth.token_problem(f"Bearer {TOKEN}") is None and auth.token_problem("Bearer next-token") is None
    for content, why in (("", "no token"), ("two words\n", "a space"), (b"\xff", "not UTF-8")):
        bad = tmp_path / "bad"
        bad.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(AuthConfigError, match=why):
            ReceiverAuth(str(bad))
    with pytest.raises(AuthConfigError, match=r"--auth-token-file .*No such file"):
        ReceiverAuth(str(tmp_path / "missing"))
    assert ReceiverAuth.load() is None
    with pytest.raises(AuthConfigError, match="--tls-client-nodes-file needs mutual TLS"):
        ReceiverAuth.load(nodes_file=str(token_file))


def test_the_forged_post_without_the_token_is_refused_on_both_transports(start_receiver, token_file, caplog):
    """Issue #16: one unauthenticated POST replaying node-0002's request with gpu-0's uncorrected-ECC
    counter raised made that GPU Unhealthy. With a token configured it is refused, counted, one log
    line each, and the receiver goes on serving."""
    caplog.set_level(logging.WARNING, logger="otel_dra.receivers.otlp")
    receiver, inbox = start_receiver(auth=ReceiverAuth(str(token_file)))
    honest = node_request("node-0002", T0)
    attack = forged(honest).SerializeToString()
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert post(receiver.http_port, honest.SerializeToString(), **bearer)[0] == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        status, body = post(receiver.http_port, attack, **headers)
        assert status == 401, headers
        assert status_pb2.Status.FromString(body).code == code_pb2.UNAUTHENTICATED
    request = urllib.request.Request(
        f"http://127.0.0.1:{receiver.http_port}/v1/metrics", data=attack, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=5)
    assert err.value.code == 401 and err.value.headers["WWW-Authenticate"].startswith("Bearer")
    code, details = raw_grpc(receiver.grpc_port, attack)
    assert code is grpc.StatusCode.UNAUTHENTICATED and "unauthenticated" in str(details)
    with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
        call = channel.unary_unary(EXPORT)
        with pytest.raises(grpc.RpcError) as rpc:
            call(attack, timeout=5, metadata=(("authorization", "Bearer wrong"),))
        assert rpc.value.code() is grpc.StatusCode.UNAUTHENTICATED
        later = forged(honest, 2).SerializeToString()  # with the token, it goes in: the token is the check
        ExportMetricsServiceResponse.FromString(
            call(later, timeout=5, metadata=(("authorization", f"Bearer {TOKEN}"),))
        )
    assert len({f.time_unix_nano for f in inbox.frames("node-0002")}) == 2, "the honest request and the token holder's"
    requests = receiver.stats()["requests"]
    assert requests[("http", "unauthenticated")] == 4 and requests[("grpc", "unauthenticated")] == 2
    assert requests[("http", "ok")] == 1 and requests[("grpc", "ok")] == 1
    lines = [r.getMessage() for r in caplog.records if "unauthenticated request" in r.getMessage()]
    assert len(lines) == 6 and all("\n" not in line for line in lines)
    assert "no authorization header" in lines[0] and "a wrong token" in lines[1]


def test_a_push_on_a_kept_connection_needs_the_token_too(start_receiver, token_file):
    """The SDK exporter keeps its connection, and such pushes are answered where they arrive: without the
    token, or with a wrong one, they are still refused (401, counted), and the token holder's goes in."""
    receiver, inbox = start_receiver(auth=ReceiverAuth(str(token_file)), grpc_endpoint=None)
    body = node_request("node-0002", T0).SerializeToString()
    for headers, status in (
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        ({"Authorization": f"Bearer {TOKEN}"}, 200),
    ):
        conn = http.client.HTTPConnection("127.0.0.1", receiver.http_port, timeout=5)
        conn.request("POST", "/v1/metrics", body, {"Content-Type": "application/x-protobuf", **headers})
        reply = conn.getresponse()
        assert (reply.status, reply.will_close) == (status, status == 401), headers
        reply.read()
        conn.close()
    requests = receiver.stats()["requests"]
    assert requests[("http", "unauthenticated")] == 2 and requests[("http", "ok")] == 1
    assert len(inbox.frames("node-0002")) == 1


def test_the_token_file_is_read_again_when_it_changes(start_receiver, token_file, caplog):
    receiver, _ = start_receiver(auth=ReceiverAuth(str(token_file)), grpc_endpoint=None)
    body = req(resource("node-1", gauge("hw.power", pt(gpu(), 250.0, T0)))).SerializeToString()
    token_file.write_text("the-new-token\n")
    wait_for(lambda: post(receiver.http_port, body, Authorization="Bearer the-new-token")[0] == 200, 10, "new token")
    assert post(receiver.http_port, body, Authorization=f"Bearer {TOKEN}")[0] == 401
    token_file.write_text("")  # a rotation half done: the last good token stays
    time.sleep(RELOAD_CHECK_S * 1.5)
    assert post(receiver.http_port, body, Authorization="Bearer the-new-token")[0] == 200
    assert "--auth-token-file changed but cannot be used" in caplog.text


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_sdk_exporters_send_the_token_from_otel_exporter_otlp_headers(
    monkeypatch, start_receiver, token_file, protocol
):
    """The agents' standard variable: the OpenTelemetry Python exporters URL-decode its value."""
    receiver, inbox = start_receiver(auth=ReceiverAuth(str(token_file)))
    port = receiver.grpc_port if protocol == "grpc" else receiver.http_port
    agent = Agent("node-sdk", devices=1)
    try:
        _, data = agent.sample(T0)
        for key in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_METRICS_HEADERS"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "3")
        without = provider.otlp_exporter(f"http://127.0.0.1:{port}", protocol)
        assert without.export(data) is MetricExportResult.FAILURE
        without.shutdown()
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer%20{TOKEN}")
        exporter = provider.otlp_exporter(f"http://127.0.0.1:{port}", protocol)
        assert exporter.export(data) is MetricExportResult.SUCCESS
        exporter.shutdown()
    finally:
        agent.close()
    assert {f.devices.node for f in inbox.frames()} == {"node-sdk"}


# -- a certificate speaks for the node it names --------------------------------------------------------------
def uri_cert(ca: trustme.CA, uri: str, where: Path) -> tuple[Path, Path]:
    """A client certificate whose only name is ``uri`` (trustme makes DNS, IP and e-mail names only)."""
    ca_key = serialization.load_pem_private_key(ca.private_key_pem.bytes(), None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "otel-dra tests")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]  # why: any private key type, an EC one here
    )
    cert_file, key_file = where / "uri.pem", where / "uri.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


class Clients:
    """A CA, the fleet's server certificate, and client certificates: node-a's, node-b's, a Collector's,
    and node-c's SPIFFE-style URI."""

    def __init__(self, where: Path) -> None:
        self.ca = trustme.CA()
        self.ca_file = where / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.files: dict[str, tuple[Path, Path]] = {}
        for name, identity in (("server", "127.0.0.1"), ("node-a", "node-a"), ("node-b", "node-b")):
            self.files[name] = self._issue(where, name, identity)
        self.files["collector"] = self._issue(where, "collector", COLLECTOR)
        self.files["node-c"] = uri_cert(self.ca, SPIFFE.replace("{node}", "node-c"), where)
        self.nodes_file = where / "client-nodes.yaml"
        self.nodes_file.write_text(f"# the Collector forwards for every node\n{COLLECTOR}: ['*']\n")

    def _issue(self, where: Path, name: str, identity: str) -> tuple[Path, Path]:
        cert = self.ca.issue_cert(identity)
        cert_file, key_file = where / f"{name}.pem", where / f"{name}.key"
        cert_file.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key_file))
        return cert_file, key_file

    def tls(self) -> TlsSettings:
        cert, key = self.files["server"]
        tls = TlsSettings.load(str(cert), str(key), str(self.ca_file))
        assert tls is not None
        return tls

    def export(self, client: str, port: int, protocol: str, request: ExportMetricsServiceRequest) -> tuple[int, str]:
        """One export with ``client``'s certificate: (points rejected, partial success's message)."""
        cert_file, key_file = self.files[client]
        if protocol == "grpc":
            creds = grpc.ssl_channel_credentials(
                self.ca_file.read_bytes(), key_file.read_bytes(), cert_file.read_bytes()
            )
            with grpc.secure_channel(f"127.0.0.1:{port}", creds) as channel:
                raw = channel.unary_unary(EXPORT)(request.SerializeToString(), timeout=5)
        else:
            ctx = ssl.create_default_context(cafile=str(self.ca_file))
            ctx.load_cert_chain(str(cert_file), str(key_file))
            http = urllib.request.Request(
                f"https://127.0.0.1:{port}/v1/metrics",
                data=request.SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"},
            )
            with urllib.request.urlopen(http, context=ctx, timeout=5) as resp:
                assert resp.status == 200
                raw = resp.read()
        partial = ExportMetricsServiceResponse.FromString(raw).partial_success
        return partial.rejected_data_points, partial.error_message


@pytest.fixture(scope="module")
def clients(tmp_path_factory) -> Clients:
    return Clients(tmp_path_factory.mktemp("clients"))


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_certificate_for_node_a_may_not_report_node_b(start_receiver, clients, caplog, protocol):
    """Issue #16: with mutual TLS any agent's certificate could report for any k8s.node.name. Now
    node-a's certificate is taken for node-a and refused for node-b (counted, quoted in partial
    success, one log line); a Collector's certificate in the nodes file forwards for both."""
    caplog.set_level(logging.WARNING, logger="otel_dra.receivers.otlp")
    auth = ReceiverAuth(nodes=ClientNodes(str(clients.nodes_file), SPIFFE))
    receiver, inbox = start_receiver(tls=clients.tls(), auth=auth)
    port = receiver.grpc_port if protocol == "grpc" else receiver.http_port
    assert port is not None
    own = node_request("node-a", T0)
    assert clients.export("node-a", port, protocol, own) == (0, "")
    b = node_request("node-b", T0)
    rejected, message = clients.export("node-a", port, protocol, b)
    assert rejected == points_of(b) and "node-b refused: this client may not report for it" in message
    assert {f.devices.node for f in inbox.frames()} == {"node-a"}
    # The replay: node-b's certificate sends node-a's own request again, later, with a raised ECC counter.
    assert clients.export("node-b", port, protocol, forged(own, 5))[0] == points_of(own)
    assert len(inbox.frames("node-a")) == 1
    # One request of two nodes: the certificate's own node is taken, the other refused.
    assert clients.export("node-b", port, protocol, two_nodes("node-a", "node-b", time.time_ns()))[0] == 1
    assert {f.devices.node for f in inbox.frames()} == {"node-a", "node-b"}
    # A Collector forwards for both; a URI name (SPIFFE) speaks for its node only.
    assert clients.export("collector", port, protocol, two_nodes("node-a", "node-b", time.time_ns()))[0] == 0
    assert clients.export("node-c", port, protocol, two_nodes("node-c", "node-a", time.time_ns()))[0] == 1
    assert inbox.frames("node-c")
    assert receiver.stats()["refused"][FORBIDDEN_NODE] == points_of(b) + points_of(own) + 2
    lines = [r.getMessage() for r in caplog.records if "may not report for node" in r.getMessage()]
    assert len(lines) == 4 and "certificate names node-a may not report for node node-b" in lines[0]
    assert all("\n" not in line for line in lines)


def test_the_nodes_file_is_checked_and_read_again(tmp_path, clients, start_receiver):
    bad = tmp_path / "bad.yaml"
    for text, why in (
        ("[a, b]", "must map"),
        ("x: 3", "a list of node names"),
        ("x: [Not_A_Node]", "not a Kubernetes"),
    ):
        bad.write_text(text)
        with pytest.raises(AuthConfigError, match=why):
            ClientNodes(str(bad))
    with pytest.raises(AuthConfigError, match="--tls-client-node-uri"):
        ClientNodes(None, "spiffe://example.org/node")
    assert NodeGrants.parse("f", b"'*': ['*']").grants == {"*": frozenset({"*"})}
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("")
    receiver, inbox = start_receiver(tls=clients.tls(), auth=ReceiverAuth(nodes=ClientNodes(str(nodes))))
    assert receiver.http_port is not None
    one = req(resource("node-z", gauge("hw.power", pt(gpu(), 250.0, T0))))
    assert clients.export("collector", receiver.http_port, "http/protobuf", one)[0] == 1
    nodes.write_text(f"{COLLECTOR}: [node-z]\n")
    later = req(resource("node-z", gauge("hw.power", pt(gpu(), 250.0, T0 + S))))
    wait_for(lambda: clients.export("collector", receiver.http_port, "http/protobuf", later)[0] == 0, 10, "the grant")
    assert inbox.frames("node-z")


def test_mutual_tls_without_a_nodes_file_still_checks_the_node(start_receiver, clients):
    receiver, inbox = start_receiver(tls=clients.tls())
    assert receiver.grpc_port is not None
    assert clients.export("node-a", receiver.grpc_port, "grpc", two_nodes("node-a", "node-b", T0))[0] == 1
    assert {f.devices.node for f in inbox.frames()} == {"node-a"}
