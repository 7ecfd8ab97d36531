"""Chapter 14's router under clients that leave early: whether a client disconnects while the
router waits for the replica's headers, before the first byte of the body or mid-stream, the
replica's in-flight count (which the least-loaded policy reads) and the upstream stream go back to
zero, as the router's /metrics and the replica's own count of open streams show."""

import asyncio
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from minillm.bench.online import free_port
from minillm.router.app import Router, build_router_app


class FakeReplica:
    """A replica that waits `header_delay` before its headers, then streams a chunk every 0.2 s
    for 5 s, counting the streams that are open."""

    def __init__(self):
        self.open_streams, self.header_delay = 0, 0.0
        app = FastAPI()

        @app.get("/health")
        async def health():
            return {"status": "ok"}

        @app.get("/metrics")
        async def metrics():
            return StreamingResponse(iter([b"vllm:num_requests_waiting 0\n"]))

        @app.post("/v1/completions")
        async def completions():
            await asyncio.sleep(self.header_delay)
            self.open_streams += 1

            async def body():
                try:
                    for i in range(25):
                        yield f"data: {i}\n\n".encode()
                        await asyncio.sleep(0.2)
                finally:
                    self.open_streams -= 1

            return StreamingResponse(body(), media_type="text/event-stream")

        self.app = app


def serve(app, port: int) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    return server


def router_in_flight(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines() if "in_flight{" in line]
    assert values, "the router exports no in-flight gauge"
    return sum(map(float, values))


def raw_request(port: int) -> socket.socket:
    body = b'{"model": "m", "prompt": "hi", "stream": true}'
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return s


@pytest.fixture(scope="module")
def fleet():
    replica = FakeReplica()
    rport, port = free_port(), free_port()
    servers = [serve(replica.app, rport)]
    router = Router([f"http://127.0.0.1:{rport}"], policy="least_loaded", poll_interval=0.2)
    servers.append(serve(build_router_app(router), port))
    yield replica, router, f"http://127.0.0.1:{port}", port
    for s in servers:
        s.should_exit = True


@pytest.mark.parametrize("when", ["before headers", "before the first byte", "mid-stream"])
def test_a_client_that_leaves_leaks_nothing(fleet, when):
    replica, router, url, port = fleet
    replica.header_delay = 1.0 if when == "before headers" else 0.0
    s = raw_request(port)
    if when == "before headers":
        time.sleep(0.3)  # the router is waiting for the replica
    elif when == "before the first byte":
        time.sleep(0.05)
    else:
        assert s.recv(1024)  # headers and some events
        time.sleep(0.5)
    s.close()
    deadline = time.monotonic() + 10
    while router_in_flight(url) or replica.open_streams or router.replicas[0].in_flight:
        assert time.monotonic() < deadline, (
            f"left behind: router in-flight {router.replicas[0].in_flight}, "
            f"open upstream streams {replica.open_streams}"
        )
        time.sleep(0.1)
    # and the router still serves
    with httpx.stream("POST", f"{url}/v1/completions", json={"prompt": "x"}) as r:
        assert r.status_code == 200
        assert next(r.iter_raw())
