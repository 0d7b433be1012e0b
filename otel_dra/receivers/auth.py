"""Who may speak for a node: the fleet's receivers' authentication and authorization.

Two checks, on both transports, both optional and both together when both are set:

- **A bearer token** (``--auth-token-file``), as the Collector's ``bearertokenauth`` extension checks
  one: HTTP ``Authorization: Bearer <token>`` (401 with ``WWW-Authenticate: Bearer`` when missing or
  wrong), gRPC metadata ``authorization: Bearer <token>`` (UNAUTHENTICATED). Agents send it with the
  standard ``OTEL_EXPORTER_OTLP_HEADERS=authorization=Bearer%20<token>``, which the OpenTelemetry
  exporters read themselves. The file holds one token a line (two during a rotation); it is read
  again when it changes, and compared in constant time (``hmac.compare_digest``). A token says who
  may send, not for which node: any holder may report for any node.
- **A client certificate speaks for the node it names** (with mutual TLS, ``--tls-client-ca-file``):
  a DNS name in its subject alternative names equal to the resource's ``k8s.node.name``, or a URI
  of the form ``--tls-client-node-uri`` gives (``spiffe://example.org/node/{node}``). A
  ``--tls-client-nodes-file`` maps certificate identities (a DNS or URI SAN; ``"*"``: every
  certificate from the CA) to the nodes they may report for besides (``"*"``: all), so a Collector
  forwards for many. The file is read again when it changes. Points of a node the client may not
  report for are refused, counted by reason (``forbidden_node``), before the decoder keeps anything
  of them. The subject's common name is not read (RFC 6125: names are in the SAN).

A file that changed but can't be used (empty, not YAML) is one log line, and the previous contents
are kept, as for the TLS files.
"""

from __future__ import annotations

import hmac
import itertools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

import yaml

from otel_dra.decode.limits import node_name_problem
from otel_dra.receivers.watched import WatchedFiles

log = logging.getLogger(__name__)

#: Seconds between looks (a stat) at the token and nodes files, taken when a request arrives.
RELOAD_CHECK_S: Final = 1.0
#: The authentication scheme (RFC 6750), compared without regard to case, as HTTP schemes are.
SCHEME: Final = "Bearer"
#: A certificate identity (a key of the nodes file), or a node (a value), that stands for every one.
ANY: Final = "*"
#: Where a client certificate's node goes in ``--tls-client-node-uri``.
NODE_FIELD: Final = "{node}"
#: Nodes a speaker remembers refusing in one request (for the one log line), past which it counts them.
MAX_REFUSED_NAMED: Final = 4

T = TypeVar("T")


class AuthConfigError(ValueError):
    """A token or nodes file, or a flag, a user must fix; the message names the flag."""


class WatchedFile(Generic[T]):
    """A file's contents, parsed (:class:`~otel_dra.receivers.watched.WatchedFiles`): at start a file that
    can't be read or parsed is fatal (:class:`AuthConfigError` naming the flag)."""

    def __init__(
        self, flag: str, path: str, parse: Callable[[str, bytes], T], check_every_s: float = RELOAD_CHECK_S
    ) -> None:
        self.flag, self.path = flag, path

        def load() -> T:
            try:
                data = Path(path).read_bytes()
            except OSError as exc:
                raise AuthConfigError(f"{flag} {path}: {exc.strerror or exc}") from None
            return parse(f"{flag} {path}", data)

        self._files = WatchedFiles(
            (path,),
            load,
            f"{flag} changed but cannot be used (%s); still using its previous contents",
            f"{flag} changed: {path} read again",
            check_every_s,
            log,
        )

    def current(self) -> T:
        return self._files.current()


# -- the bearer token ------------------------------------------------------------------------------
def parse_tokens(where: str, data: bytes) -> tuple[bytes, ...]:
    """The tokens of a token file: one a line, blank lines and ``#`` comments skipped."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthConfigError(f"{where}: not UTF-8 text") from None
    tokens = tuple(line.strip().encode() for line in text.splitlines() if line.strip() and not line.startswith("#"))
    if not tokens:
        raise AuthConfigError(f"{where}: no token in it (one a line)")
    for token in tokens:
        if any(c <= 0x20 or c == 0x7F for c in token):
            raise AuthConfigError(f"{where}: a token has a space or a control character in it")
    return tokens


def token_problem(header: str | None, tokens: Iterable[bytes]) -> str | None:
    """Why an ``Authorization`` value does not carry one of ``tokens`` (None: it does), in a few words
    for the log; the comparison takes the same time whichever token, or part of one, matches."""
    if header is None:
        return "no authorization header"
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != SCHEME.lower():
        return f"not a {SCHEME} token"
    offered = given.strip().encode("utf-8", "replace")
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(offered, token)
    return None if matched else "a wrong token"


# -- which nodes a certificate speaks for ------------------------------------------------------------
@dataclass(frozen=True)
class NodeGrants:
    """A nodes file's contents: certificate identity -> the nodes it may report for (``ANY``: all)."""

    grants: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, where: str, data: bytes) -> NodeGrants:
        try:
            doc = yaml.safe_load(data)
        except (yaml.YAMLError, RecursionError) as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise AuthConfigError(f"{where}: not YAML ({first})") from None
        if doc is None:
            return cls()
        if not isinstance(doc, dict):
            raise AuthConfigError(f"{where}: must map certificate identities to lists of node names")
        grants: dict[str, frozenset[str]] = {}
        for identity, nodes in doc.items():
            if not isinstance(identity, str) or not identity:
                raise AuthConfigError(f"{where}: a key is not a certificate identity (a DNS name or URI): {identity!r}")
            listed = [nodes] if isinstance(nodes, str) else nodes
            if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
                raise AuthConfigError(f'{where}: {identity}: give a list of node names, or "*" for every node')
            for node in listed:
                if node != ANY and node_name_problem(node) is not None:
                    raise AuthConfigError(f"{where}: {identity}: {node!r} is not a Kubernetes node name")
            grants[identity] = frozenset(listed)
        return cls(grants)


@dataclass
class Speaker:
    """One request's client, as the decoders ask it (``speaker(node)``): may it report for ``node``?
    Remembers the nodes it refused, for the receiver's one log line."""

    who: str  # its identities, for that line
    nodes: frozenset[str]
    any_node: bool = False
    uri: str | None = None  # --tls-client-node-uri
    uris: frozenset[str] = frozenset()
    _refused: dict[str, None] = field(default_factory=dict)  # in the order refused

    def __call__(self, node: str) -> bool:
        if (
            self.any_node
            or node in self.nodes
            or (self.uri is not None and self.uri.replace(NODE_FIELD, node) in self.uris)
        ):
            return True
        self._refused[node] = None
        return False

    @property
    def refused(self) -> list[str]:
        """The first few nodes refused (MAX_REFUSED_NAMED), for a log line."""
        return list(itertools.islice(self._refused, MAX_REFUSED_NAMED))

    @property
    def refused_count(self) -> int:
        """How many distinct nodes were refused."""
        return len(self._refused)


class ClientNodes:
    """The policy: which nodes a client certificate may speak for (see the module docstring)."""

    def __init__(self, nodes_file: str | None = None, node_uri: str | None = None) -> None:
        if node_uri is not None and (node_uri.count(NODE_FIELD) != 1 or ":" not in node_uri.split(NODE_FIELD)[0]):
            raise AuthConfigError(
                f"--tls-client-node-uri {node_uri!r}: give a URI with {NODE_FIELD} once where the node's name "
                "is, e.g. spiffe://example.org/node/{node}"
            )
        self.node_uri = node_uri
        self.nodes_file = nodes_file
        self._grants = WatchedFile("--tls-client-nodes-file", nodes_file, NodeGrants.parse) if nodes_file else None

    def speaker(self, dns: Iterable[str], uris: Iterable[str]) -> Speaker:
        """What a certificate with these DNS and URI SANs may report for."""
        dns_names, uri_names = frozenset(dns), frozenset(uris)
        identities = dns_names | uri_names
        nodes = set(dns_names)
        grants = self._grants.current().grants if self._grants is not None else {}
        for identity in (*identities, ANY):
            nodes |= grants.get(identity, frozenset())
        who = ", ".join(sorted(identities)[:3]) or "no DNS or URI name"
        return Speaker(who, frozenset(nodes - {ANY}), ANY in nodes, self.node_uri, uri_names)

    def cert_speaker(self, peercert: Mapping[str, Any] | None) -> Speaker:
        """From ``ssl.SSLSocket.getpeercert()``'s dict (its ``subjectAltName`` pairs); both transports
        terminate TLS in Python (the gRPC port in its front), so both ask this."""
        sans = (peercert or {}).get("subjectAltName", ())
        return self.speaker((v for k, v in sans if k == "DNS"), (v for k, v in sans if k == "URI"))


# -- the whole check -----------------------------------------------------------------------------------
class ReceiverAuth:
    """The receiver's checks: the bearer token (when ``token_file``) and, with mutual TLS, the nodes a
    client certificate may speak for (``nodes``). Raises :class:`AuthConfigError` on a bad file."""

    def __init__(self, token_file: str | None = None, nodes: ClientNodes | None = None) -> None:
        self.token_file = token_file
        self._tokens = WatchedFile("--auth-token-file", token_file, parse_tokens) if token_file else None
        self.nodes = nodes or ClientNodes()

    @classmethod
    def load(
        cls,
        token_file: str | None = None,
        nodes_file: str | None = None,
        node_uri: str | None = None,
        mutual: bool = False,
    ) -> ReceiverAuth | None:
        """The checks the flags ask for; None for none. The nodes flags need mutual TLS."""
        if (nodes_file or node_uri) and not mutual:
            flag = "--tls-client-nodes-file" if nodes_file else "--tls-client-node-uri"
            raise AuthConfigError(f"{flag} needs mutual TLS (--tls-client-ca-file): it reads the client's certificate")
        if not (token_file or nodes_file or node_uri):
            return None
        return cls(token_file or None, ClientNodes(nodes_file or None, node_uri or None))

    @property
    def token(self) -> bool:
        return self._tokens is not None

    def token_problem(self, header: str | None) -> str | None:
        """Why a request's ``Authorization`` value is refused (None: it is not, or no token is asked for)."""
        if self._tokens is None:
            return None
        return token_problem(header, self._tokens.current())


def describe(auth: ReceiverAuth | None, mutual: bool) -> str:
    """What the receiver asks of a client, in the words its log lines use."""
    parts = ["a bearer token"] if auth is not None and auth.token else []
    if mutual:
        parts.append("a certificate naming the node it reports for")
    return " and ".join(parts) if parts else "no authentication"
