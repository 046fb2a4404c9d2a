"""A small OpenID provider over real HTTP for the trust-boundary tests: discovery, a key set
that can rotate, and a token endpoint that records every code exchanged. Its ID tokens are
RS256, signed with keys made here. The browser journeys use node-oidc-provider
(tests/e2e/test_sign_in.py); this one lets a test say exactly what the provider answers."""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

CLIENT_ID = "lorahub"
CLIENT_SECRET = "lorahub-idp-test-secret"


class Idp:
    def __init__(self, *, trailing_slash: bool = False) -> None:
        self.keys: list[tuple[str, rsa.RSAPrivateKey]] = []
        self.rotate()
        self.exchanged: list[str] = []  # codes the token endpoint was asked for
        self.nonce: str | None = None  # the nonce the next ID token carries (None: no claim)
        self.claims: dict = {"sub": "sub-sam", "preferred_username": "sam", "groups": []}
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def _json(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.endswith("/.well-known/openid-configuration"):
                    self._json(idp.discovery())
                elif self.path.endswith("/jwks"):
                    self._json({"keys": [idp.public_jwk(kid, key) for kid, key in idp.keys]})
                else:
                    self.send_error(404)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                idp.exchanged.append(form.get("code", [""])[0])
                self._json(
                    {"access_token": "at", "token_type": "Bearer", "id_token": idp.id_token()}
                )

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        base = f"http://127.0.0.1:{self.server.server_port}/realm"
        self.base = base
        self.issuer = base + "/" if trailing_slash else base
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def rotate(self) -> str:
        """Publish a new key and sign with it from now on."""
        kid = uuid.uuid4().hex[:12]
        self.keys.insert(0, (kid, rsa.generate_private_key(public_exponent=65537, key_size=2048)))
        return kid

    @staticmethod
    def public_jwk(kid: str, key: rsa.RSAPrivateKey) -> dict:
        return {**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": kid, "use": "sig"}

    def discovery(self) -> dict:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.base}/auth",
            "token_endpoint": f"{self.base}/token",
            "jwks_uri": f"{self.base}/jwks",
        }

    def id_token(self) -> str:
        kid, key = self.keys[0]
        now = int(time.time())
        claims = {"iss": self.issuer, "aud": CLIENT_ID, "iat": now, "exp": now + 300}
        claims.update(self.claims)
        if self.nonce is not None:
            claims["nonce"] = self.nonce
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
