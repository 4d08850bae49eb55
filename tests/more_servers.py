"""Real servers of the other object stores, on loopback, for the storage tests (no mock of any client):

- :func:`azurite` — Microsoft's Azure Storage emulator (the npm package ``azurite``, installed by the Makefile under
  ``.venv/node`` when npm is on the machine), its blob service on a free port, in memory; the ``AZURE_*`` environment
  that ``obstore`` (and every Azure SDK) reads is set for the block: ``az://CONTAINER/key`` then reaches it.
- :func:`range_http_server` — an HTTP server of a local folder that serves byte ranges (``rangehttpserver``, the
  standard library's ``SimpleHTTPRequestHandler`` with ``Range``), for ``http(s)://`` reads.
- :func:`fault_proxy` — an HTTP proxy on loopback in front of a real server (moto's S3) that injects faults into the
  next requests it is told to: no answer at all (a stalled server), or one byte of the answer's body flipped (corruption
  in transit); every other request is forwarded as it is.
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

__all__ = [
    "AZURITE_BIN",
    "FaultProxy",
    "azurite",
    "azurite_server",
    "create_container",
    "fault_proxy",
    "precondition_dropping_proxy",
    "range_http_server",
]

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
    with azurite_server(binary) as (endpoint, _):
        yield endpoint


@contextlib.contextmanager
def azurite_server(binary: Path = AZURITE_BIN) -> Iterator[tuple[str, subprocess.Popen]]:
    """:func:`azurite`, yielding its process too (``(endpoint, process)``: a benchmark counts the server's CPU time)."""
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
        yield f"http://127.0.0.1:{port}/{ACCOUNT}", process
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


class FaultProxy:
    """The faults a :func:`fault_proxy` injects: :meth:`stall` and :meth:`flip` arm a fault for the next ``times``
    requests whose path contains ``path_part`` (GETs only for a flip); ``seen`` lists ``(method, path, fault)`` of every
    request, in order (``fault``: ``"stall"``, ``"flip"`` or ``""``)."""

    def __init__(self, endpoint: str, upstream: str) -> None:
        self.endpoint, self.upstream = endpoint, upstream
        self.seen: list[tuple[str, str, str]] = []
        self.answered: list[tuple[str, str, str, int]] = []
        self.arrivals: list[tuple[float, int, str, str, str]] = []
        self.in_flight = self.peak_in_flight = 0
        self._armed: list[list] = []  # [fault, path_part, times left]
        self._lock = threading.Lock()
        self.released = threading.Event()  # set when the proxy stops: a stalled request's thread then ends

    def stall(self, path_part: str, times: int = 1, method: str = "") -> None:
        """Answer nothing to the next ``times`` requests whose path contains ``path_part`` (of ``method`` only, when
        given)."""
        with self._lock:
            self._armed.append(["stall" + (f":{method}" if method else ""), path_part, times])

    def disarm(self) -> None:
        """Inject nothing more (the requests already stalled stay so)."""
        with self._lock:
            self._armed.clear()

    def flip(self, path_part: str, times: int = 1) -> None:
        with self._lock:
            self._armed.append(["flip", path_part, times])

    def fault_for(self, method: str, path: str) -> str:
        with self._lock:
            fault = ""
            for armed in self._armed:
                kind, part, left = armed
                kind, _, only = kind.partition(":")
                if left > 0 and part in path and (kind == "stall" or method == "GET") and only in ("", method):
                    armed[2] -= 1
                    fault = kind
                    break
            self.seen.append((method, path, fault))
            return fault

    def arrive(self, delta: int, request: tuple[int, str, str, str] | None = None) -> None:
        with self._lock:
            if request is not None:
                self.arrivals.append((time.perf_counter(), *request))
            self.in_flight += delta
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def answer(self, method: str, path: str, byte_range: str, num_bytes: int) -> None:
        with self._lock:
            self.answered.append((method, path, byte_range, num_bytes))

    def fetched(self, path_part: str = "") -> tuple[int, int]:
        """``(GET requests, bytes of their bodies)`` answered so far for paths containing ``path_part``."""
        with self._lock:
            got = [n for m, p, _, n in self.answered if m == "GET" and path_part in p]
        return len(got), sum(got)


@contextlib.contextmanager
def fault_proxy(upstream: str, drop_headers: tuple[str, ...] = (), hold_s: float = 0.0) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` listening on a free loopback port (its ``endpoint``) that forwards every request to
    ``upstream`` (``http://host:port``), without the request headers named in ``drop_headers`` (lower case), each held
    ``hold_s`` seconds before it is forwarded (a round trip's latency), for the block. Point a client at it with
    ``AWS_ENDPOINT_URL``."""
    import http.client
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlsplit

    target = urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _forward(self) -> None:
            proxy.arrive(1, (self.client_address[1], self.command, self.path, self.headers.get("Range") or ""))
            try:
                if hold_s:
                    time.sleep(hold_s)
                self._answer()
            finally:
                proxy.arrive(-1)

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            fault = proxy.fault_for(self.command, self.path)
            if fault == "stall":  # read the request, answer nothing, hold the connection
                proxy.released.wait()
                self.close_connection = True
                return
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in drop_headers}
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                headers = answer.getheaders()
            finally:
                conn.close()
            if fault == "flip" and data:
                at = len(data) // 2
                data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
            # recorded before the client can see the answer: a count read after a request returns includes it
            proxy.answer(self.command, self.path, self.headers.get("Range") or "", len(data))
            self.send_response(answer.status, answer.reason)
            skip = {"content-length", "transfer-encoding", "connection", "date", "server"}
            for name, value in headers:
                if name.lower() not in skip or (self.command == "HEAD" and name.lower() == "content-length"):
                    self.send_header(name, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    proxy = FaultProxy(f"http://127.0.0.1:{server.server_address[1]}", upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.released.set()
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def precondition_dropping_proxy(upstream: str) -> Iterator[str]:
    """``http://127.0.0.1:PORT``: a real HTTP proxy to ``upstream`` (e.g. moto's S3 server) that drops the
    ``If-None-Match`` and ``If-Match`` request headers, as an S3-compatible store that ignores preconditions does
    (the PUT succeeds and overwrites), for the block."""
    with fault_proxy(upstream, drop_headers=("if-none-match", "if-match")) as proxy:
        yield proxy.endpoint
