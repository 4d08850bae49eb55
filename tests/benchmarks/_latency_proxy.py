"""A TCP proxy on loopback that adds a fixed latency to every request: benchmark 17's stand-in for a distant bucket.

``python -m tests.benchmarks._latency_proxy LISTEN_PORT UPSTREAM_PORT LATENCY_MS`` forwards 127.0.0.1:LISTEN_PORT to
127.0.0.1:UPSTREAM_PORT. On each connection, the first bytes of the server's answer to each request (client bytes,
then server bytes) are held ``LATENCY_MS`` before they are passed on: one added round trip per HTTP request, whatever
its size; requests on different connections wait in parallel, as they would on a real network. Prints ``ready`` once
it listens; on SIGTERM it prints one JSON line (requests, bytes to the client) and exits.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys

COUNTS = {"requests": 0, "bytes_to_client": 0}


async def _pipe(reader, writer, latency: float, state: dict, to_client: bool) -> None:
    try:
        while data := await reader.read(1 << 16):
            if to_client:
                if state["waiting"]:
                    state["waiting"] = False
                    await asyncio.sleep(latency)
                COUNTS["bytes_to_client"] += len(data)
            elif not state["waiting"]:
                state["waiting"] = True
                COUNTS["requests"] += 1
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def _main(listen: int, upstream: int, latency: float) -> None:
    async def handle(client_reader, client_writer):
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            client_writer.close()
            return
        state = {"waiting": False}
        await asyncio.gather(
            _pipe(client_reader, server_writer, latency, state, False),
            _pipe(server_reader, client_writer, latency, state, True),
        )

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    async with server:
        await stop.wait()
    print(json.dumps(COUNTS), flush=True)


if __name__ == "__main__":
    asyncio.run(_main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000))
