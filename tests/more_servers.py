"""Real servers of the other object stores, on loopback, for the storage tests (no mock of any client):

- :func:`azurite` — Microsoft's Azure Storage emulator (the npm package ``azurite``, installed by the Makefile under
  ``.venv/node`` when npm is on the machine), its blob service on a free port, in memory; the ``AZURE_*`` environment
  that ``obstore`` (and every Azure SDK) reads is set for the block: ``az://CONTAINER/key`` then reaches it.
- :func:`range_http_server` — an HTTP server of a local folder that serves byte ranges (``rangehttpserver``, the
  standard library's ``SimpleHTTPRequestHandler`` with ``Range``), for ``http(s)://`` reads.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from tests.s3_server import free_port

__all__ = ["AZURITE_BIN", "azurite", "create_container", "precondition_dropping_proxy", "range_http_server"]

ROOT = Path(__file__).resolve().parents[1]
AZURITE_BIN = ROOT / ".venv" / "node" / "node_modules" / ".bin" / "azurite-blob"
# The emulator's one account and its published key (https://learn.microsoft.com/azure/storage/common/storage-use-azurite)
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _wait_for_port(port: int, process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"azurite exited with {process.returncode} before listening on port {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.1)
    raise TimeoutError(f"azurite did not listen on 127.0.0.1:{port} within {timeout_s:g} s")


@contextlib.contextmanager
def azurite(binary: Path = AZURITE_BIN) -> Iterator[str]:
    """The blob endpoint (``http://127.0.0.1:PORT/devstoreaccount1``) of an azurite started for the block, with
    ``AZURE_STORAGE_USE_EMULATOR`` and ``AZURITE_BLOB_STORAGE_URL`` set; stopped and the environment restored after."""
    if not binary.exists() and shutil.which("azurite-blob") is None:
        raise FileNotFoundError(f"azurite is not installed ({binary}): npm install --prefix .venv/node azurite")
    port = free_port()
    command = [str(binary if binary.exists() else shutil.which("azurite-blob"))]
    command += ["--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence", "--skipApiVersionCheck"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    env = {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    try:
        _wait_for_port(port, process)
        os.environ.update(env)
        yield f"http://127.0.0.1:{port}/{ACCOUNT}"
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        if process.poll() is None:
            process.kill()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def create_container(endpoint: str, name: str) -> str:
    """Create container ``name`` on the emulator at ``endpoint`` (with Azure's own SDK); returns ``az://name``."""
    from azure.storage.blob import BlobServiceClient

    connection = (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};BlobEndpoint={endpoint};"
    )
    BlobServiceClient.from_connection_string(connection).create_container(name)
    return f"az://{name}"


@contextlib.contextmanager
def range_http_server(folder: Path) -> Iterator[str]:
    """``http://127.0.0.1:PORT``: ``folder`` served over HTTP with byte ranges (HEAD, GET, ``Range``), for the block."""
    from functools import partial
    from http.server import ThreadingHTTPServer

    from RangeHTTPServer import RangeRequestHandler

    class Quiet(RangeRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def precondition_dropping_proxy(upstream: str) -> Iterator[str]:
    """``http://127.0.0.1:PORT``: a real HTTP proxy to ``upstream`` (e.g. moto's S3 server) that drops the
    ``If-None-Match`` and ``If-Match`` request headers, as an S3-compatible store that ignores preconditions does
    (the PUT succeeds and overwrites), for the block."""
    import http.client
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlsplit

    target = urlsplit(upstream)

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("if-none-match", "if-match")}
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            conn.request(self.command, self.path, body=body, headers=headers)
            reply = conn.getresponse()
            data = reply.read()
            self.send_response(reply.status, reply.reason)
            for k, v in reply.getheaders():
                if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                    self.send_header(k, v)
            self.send_header("Content-Length", reply.getheader("Content-Length", "0") if not data else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
