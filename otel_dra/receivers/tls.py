"""TLS for the fleet's OTLP receiver: the Collector's ``tls`` server settings (``cert_file``,
``key_file``, ``client_ca_file``) as one validated object, made into gRPC server credentials and
an ``ssl.SSLContext`` for the HTTP side, so both transports serve the same certificate and demand
the same client certificates.

Everything is read and checked when the settings are loaded (before any port is bound), so a
wrong path, a key that doesn't match its certificate or a file that isn't PEM is one line naming
the flag, not a failure at the first client.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

import grpc


class TlsConfigError(ValueError):
    """A TLS file a user must fix; the message names the flag and the file."""


@dataclass(frozen=True)
class TlsSettings:
    """The server's certificate chain and key (PEM), and optionally the CA that client certificates
    must chain to (mutual TLS: a client without one is refused)."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    _cert: bytes = field(default=b"", repr=False, compare=False)
    _key: bytes = field(default=b"", repr=False, compare=False)
    _client_ca: bytes | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, cert_file: str | None, key_file: str | None, client_ca_file: str | None = None) -> TlsSettings | None:
        """Read and check the files; None when no TLS is asked for. Raises :class:`TlsConfigError`."""
        if not cert_file and not key_file:
            if client_ca_file:
                raise TlsConfigError("--tls-client-ca-file needs --tls-cert-file and --tls-key-file (the server's own)")
            return None
        if not cert_file or not key_file:
            missing = "--tls-key-file" if cert_file else "--tls-cert-file"
            raise TlsConfigError(f"TLS needs both --tls-cert-file and --tls-key-file; {missing} is missing")
        cert = _read("--tls-cert-file", cert_file)
        key = _read("--tls-key-file", key_file)
        client_ca = _read("--tls-client-ca-file", client_ca_file) if client_ca_file else None
        settings = cls(cert_file, key_file, client_ca_file, cert, key, client_ca)
        settings.ssl_context()  # the same checks the HTTP side will make, now
        return settings

    @property
    def mutual(self) -> bool:
        return self._client_ca is not None

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self._key, self._cert)], root_certificates=self._client_ca, require_client_auth=self.mutual
        )

    def ssl_context(self) -> ssl.SSLContext:
        """A server context: TLS 1.2 or newer, this certificate, client certificates when mutual."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except ssl.SSLError as exc:
            raise TlsConfigError(
                f"--tls-cert-file {self.cert_file} / --tls-key-file {self.key_file}: cannot use them "
                f"({exc.reason or exc}); give the PEM certificate chain and the private key that belongs to it"
            ) from None
        except OSError as exc:
            raise TlsConfigError(f"--tls-cert-file/--tls-key-file: {exc.strerror or exc}") from None
        if self._client_ca is not None:
            try:
                ctx.load_verify_locations(cadata=self._client_ca.decode("ascii", "replace"))
            except ssl.SSLError as exc:
                raise TlsConfigError(
                    f"--tls-client-ca-file {self.client_ca_file}: not a PEM CA certificate ({exc.reason or exc})"
                ) from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def describe(tls: TlsSettings | None) -> str:
    """How a receiver is secured, in the words its log lines use."""
    if tls is None:
        return "plaintext"
    return "TLS with client certificates" if tls.mutual else "TLS"


def _read(flag: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"{flag} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TlsConfigError(f"{flag} {path}: not a PEM file (no '-----BEGIN' line)")
    return data
