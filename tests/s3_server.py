"""moto's real S3 server on loopback (a free port), for the storage tests; no mock of any client.

:func:`moto_server` starts one and yields its endpoint URL with the ``AWS_*`` environment pointing at it (the variables
every S3 client reads), then stops it and restores the environment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator

__all__ = ["create_bucket", "free_port", "moto_server"]

_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server(port: int | None = None) -> Iterator[tuple[str, object]]:
    """``(endpoint, server)``: moto's ThreadedMotoServer on 127.0.0.1, the environment set for the block."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = port or free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in (*_ENV, "AWS_ENDPOINT_URL")}
    os.environ.update(_ENV, AWS_ENDPOINT_URL=endpoint)
    try:
        yield endpoint, server
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def create_bucket(endpoint: str, name: str) -> str:
    """Create bucket ``name`` on the server at ``endpoint`` (its own S3 API); returns ``s3://name``."""
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return f"s3://{name}"
