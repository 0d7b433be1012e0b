"""TLS for the fleet's OTLP receiver: the Collector's ``tls`` server settings (``cert_file``,
``key_file``, ``client_ca_file``) as one validated object, made into the ``ssl.SSLContext`` both
transports serve (the gRPC port's front terminates TLS too, offering ALPN ``h2``), so both serve the
same certificate and demand the same client certificates.

Everything is read and checked when the settings are loaded (before any port is bound), so a
wrong path, a key that doesn't match its certificate or a file that isn't PEM is one line naming
the flag, not a failure at the first client.

Certificates are rotated in place (cert-manager renews them, a Kubernetes Secret volume swaps its
files): :class:`CertificateReloader` looks at the files again (:mod:`otel_dra.receivers.watched`), at
most every ``RELOAD_CHECK_S``, when a connection arrives, and new connections get the new certificate on
both transports; a changed set that fails the start-up checks is logged and the previous one kept.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from otel_dra.component import ConfigError
from otel_dra.receivers.watched import WatchedFiles

log = logging.getLogger(__name__)

#: The ALPN protocol gRPC speaks (HTTP/2).
H2: Final = ("h2",)
#: Seconds between looks at the TLS files (a stat of each), taken when a connection arrives.
RELOAD_CHECK_S: Final = 1.0


class TlsConfigError(ConfigError):
    """A TLS file a user must fix; the message names the :class:`TlsSettings` field and the file."""


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
                raise TlsConfigError(
                    "{TlsSettings.client_ca_file} needs {TlsSettings.cert_file} and {TlsSettings.key_file} (the "
                    "server's own)"
                )
            return None
        if not cert_file or not key_file:
            missing = "{TlsSettings.key_file}" if cert_file else "{TlsSettings.cert_file}"
            raise TlsConfigError(
                f"TLS needs both {{TlsSettings.cert_file}} and {{TlsSettings.key_file}}; {missing} is missing"
            )
        return cls(cert_file, key_file, client_ca_file or None).read_again()[0]

    def read_again(self) -> tuple[TlsSettings, ssl.SSLContext]:
        """These files, read and checked (again, when a renewal has replaced them in place), and the
        server context the checks built: the HTTP side's, made once."""
        cert = _read("{TlsSettings.cert_file}", self.cert_file)
        key = _read("{TlsSettings.key_file}", self.key_file)
        client_ca = _read("{TlsSettings.client_ca_file}", self.client_ca_file) if self.client_ca_file else None
        settings = replace(self, _cert=cert, _key=key, _client_ca=client_ca)
        return settings, settings.ssl_context()

    @property
    def mutual(self) -> bool:
        return self._client_ca is not None

    def ssl_context(self, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
        """A server context: TLS 1.2 or newer, this certificate, client certificates when mutual; ``alpn``:
        the protocols to agree on (gRPC clients refuse a server that does not select ``h2``)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except ssl.SSLError as exc:
            raise TlsConfigError(
                f"{{TlsSettings.cert_file}} {self.cert_file} / {{TlsSettings.key_file}} {self.key_file}: cannot use "
                f"them ({exc.reason or exc}); give the PEM certificate chain and the private key that belongs to it"
            ) from None
        except OSError as exc:
            raise TlsConfigError(f"{{TlsSettings.cert_file}}/{{TlsSettings.key_file}}: {exc.strerror or exc}") from None
        if self._client_ca is not None:
            try:
                ctx.load_verify_locations(cadata=self._client_ca.decode("ascii", "replace"))
            except ssl.SSLError as exc:
                raise TlsConfigError(
                    f"{{TlsSettings.client_ca_file}} {self.client_ca_file}: not a PEM CA certificate "
                    f"({exc.reason or exc})"
                ) from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


class CertificateReloader:
    """The newest usable version of ``settings``' files, for each new connection (the files are
    :class:`~otel_dra.receivers.watched.WatchedFiles`, loaded again with :meth:`TlsSettings.load`'s checks)."""

    def __init__(self, settings: TlsSettings, check_every_s: float = RELOAD_CHECK_S) -> None:
        def load() -> tuple[TlsSettings, ssl.SSLContext, ssl.SSLContext]:
            new, context = settings.read_again()
            return new, context, new.ssl_context(alpn=H2)

        self._files = WatchedFiles(
            (settings.cert_file, settings.key_file, settings.client_ca_file),
            load,
            "TLS files changed but cannot be used (%s); still serving the previous certificate",
            f"TLS files changed: new connections get the certificate now in {settings.cert_file}",
            check_every_s,
            log,
            first=(settings, settings.ssl_context(), settings.ssl_context(alpn=H2)),
        )

    @property
    def version(self) -> int:
        """Loads since start: 0 is the start-up set."""
        return self._files.version

    @property
    def mutual(self) -> bool:
        """Whether client certificates are asked for (the CA file's path is fixed, so every reload agrees)."""
        return self.current()[0].mutual

    def current(self) -> tuple[TlsSettings, ssl.SSLContext]:
        """The settings and server context to use for a connection arriving now."""
        settings, context, _ = self._files.current()
        return settings, context

    def ssl_context(self) -> ssl.SSLContext:
        """The HTTP side's context for a connection arriving now."""
        return self._files.current()[1]

    def h2_context(self) -> ssl.SSLContext:
        """The gRPC side's context (ALPN ``h2``) for a connection arriving now."""
        return self._files.current()[2]


def describe(tls: TlsSettings | None) -> str:
    """How a receiver is secured, in the words its log lines use."""
    if tls is None:
        return "plaintext"
    return "TLS with client certificates" if tls.mutual else "TLS"


def _read(field: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"{field} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TlsConfigError(f"{field} {path}: not a PEM file (no '-----BEGIN' line)")
    return data
