"""The server's TLS context from --ssl-certfile/--ssl-keyfile (and --ssl-ca-certs).

Built by the entry point before anything starts, so a missing file, a key that does not
match its certificate or a bad PEM stops `tokenwire serve` with status 2 and the reason,
rather than a listener that fails every handshake.
"""
from __future__ import annotations

import asyncio
import ssl

from aiohttp import web

from common.errors import ConfigError
from gateway.config import GatewayConfig


def server_ssl_context(config: GatewayConfig) -> ssl.SSLContext | None:
    """None without --ssl-certfile; else a TLS 1.2+ server context (Python's defaults for
    ciphers), asking clients for a certificate signed by --ssl-ca-certs when it is given."""
    if not config.tls:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError("ssl_certfile", f"cannot load the certificate and key: {exc}") \
            from None
    if config.ssl_ca_certs is not None:
        try:
            context.load_verify_locations(cafile=config.ssl_ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("ssl_ca_certs", f"cannot load the CA certificates: {exc}") \
                from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class TLSSite(web.TCPSite):
    """A TCPSite whose TLS handshakes must end within `handshake_timeout_s`.

    The connection guard (gateway/sockets/guard.py) sees a connection only once its
    handshake is done, and asyncio's own bound on a handshake is 60 s: a client that
    opens connections and never finishes one would hold them that long, uncounted.
    aiohttp's TCPSite does not pass the bound on, so this start() makes the listener
    itself (as TCPSite.start does, plus the bound)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int,
                 ssl_context: ssl.SSLContext, handshake_timeout_s: float):
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self.handshake_timeout_s = handshake_timeout_s

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        self._server = await asyncio.get_running_loop().create_server(
            self._runner.server, self._host, self._port, ssl=self._ssl_context,
            backlog=self._backlog, ssl_handshake_timeout=self.handshake_timeout_s)
        self._bound_port = self._server.sockets[0].getsockname()[1]
