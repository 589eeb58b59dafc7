"""An OpenID Connect issuer on loopback over TLS, as strict as Keycloak or Dex about a refresh grant.

It serves discovery (`/.well-known/openid-configuration`) and a token endpoint that takes only
`grant_type=refresh_token` with the refresh-token it last gave out (it rotates them, as Keycloak does by
default), the client authenticated with HTTP Basic; anything else is RFC 6749's 400 `invalid_grant` or 401
`invalid_client`. What it hands out as the id-token is the caller's: here a token the real API server knows.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote_plus

from tests.security.certs import Pair, issue, make_ca


class OidcIssuer:
    def __init__(self, folder: Path, *, client_id: str, client_secret: str, refresh_token: str, id_token: str) -> None:
        self.ca = make_ca(folder / "ca", "test identity provider CA")
        leaf: Pair = issue(self.ca, folder / "leaf", "idp")
        self.client_id, self.client_secret = client_id, client_secret
        self.refresh_token, self.id_token = refresh_token, id_token
        self.calls: list[str] = []  # "GET /.well-known/...", "POST /token ok", "POST /token invalid_grant"
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(leaf.cert, leaf.key)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self._server.server_address[1]}/realms/ml"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def ca_pem(self) -> str:
        return self.ca.cert.read_text()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _token(self, form: dict[str, list[str]], authorization: str) -> tuple[int, dict[str, str]]:
        basic = f"{quote_plus(self.client_id)}:{quote_plus(self.client_secret)}"
        if authorization != "Basic " + base64.b64encode(basic.encode()).decode():
            return 401, {"error": "invalid_client"}
        if form != {"grant_type": ["refresh_token"], "refresh_token": [self.refresh_token]}:
            return 400, {"error": "invalid_grant", "error_description": "Invalid refresh token"}
        self.refresh_token += "-next"
        return 200, {"id_token": self.id_token, "refresh_token": self.refresh_token, "token_type": "Bearer"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/realms/ml/.well-known/openid-configuration":
                    return self._send(404, {"error": "not_found"})
                issuer.calls.append(f"GET {self.path}")
                return self._send(200, {"issuer": issuer.url, "token_endpoint": f"{issuer.url}/token"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length).decode()
                if self.path != "/realms/ml/token" or self.headers.get("Content-Type") != (
                    "application/x-www-form-urlencoded"
                ):
                    return self._send(400, {"error": "invalid_request"})
                status, answer = issuer._token(parse_qs(body), self.headers.get("Authorization", ""))
                issuer.calls.append(f"POST {self.path} {answer.get('error', 'ok')}")
                return self._send(status, answer)

            def _send(self, status: int, document: dict[str, str]) -> None:
                body = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler
