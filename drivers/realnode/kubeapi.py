"""Just enough of the Kubernetes API for starting real nodes: read Node objects (are they
Ready yet, which runtime do they report) and delete them at the end, with the
credentials of a kubeconfig (bearer token or client certificate, file or inline data).

Synchronous urllib on purpose: node start-up runs from plain code (a test fixture, the
``python -m drivers.realnode`` command), and one GET a tenth of a second needs no client
library. Used by :mod:`.world`.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Api:
    server: str
    context: ssl.SSLContext
    headers: dict[str, str]

    @staticmethod
    def from_kubeconfig(path: Path) -> Api:
        doc = yaml.safe_load(path.read_text())
        current = doc.get("current-context")
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == current)
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
        base = path.parent
        context = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif "certificate-authority-data" in cluster:
            context.load_verify_locations(
                cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        elif "certificate-authority" in cluster:
            context.load_verify_locations(cafile=str(base / cluster["certificate-authority"]))
        headers = {"Accept": "application/json"}
        if "token" in user:
            headers["Authorization"] = f"Bearer {user['token']}"
        cert = _material(user, "client-certificate", base)
        key = _material(user, "client-key", base)
        if cert and key:
            context.load_cert_chain(cert, key)
        return Api(cluster["server"].rstrip("/"), context, headers)

    def request(self, method: str, path: str, *, timeout: float = 10) -> Any:
        """The decoded answer; ``None`` for 404."""
        request = urllib.request.Request(self.server + path, method=method,
                                         headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout,
                                        context=self.context) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            exc.close()  # it holds the response and its socket
            if exc.code == 404:
                return None
            raise

    def node(self, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.request("GET", f"/api/v1/nodes/{name}")
        return found

    def delete_node(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/nodes/{name}")


def _material(user: dict[str, Any], key: str, base: Path) -> str | None:
    """A client certificate or key as a file path (inline data goes to a temporary file:
    ``ssl`` loads chains from files only)."""
    if f"{key}-data" in user:
        with tempfile.NamedTemporaryFile("wb", suffix=".pem", delete=False) as f:
            f.write(base64.b64decode(user[f"{key}-data"]))
            return f.name
    if key in user:
        return str(base / user[key])
    return None


def is_ready(node: dict[str, Any] | None) -> bool:
    if not node:
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in node.get("status", {}).get("conditions", []))
