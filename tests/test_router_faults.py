"""Chapter 14's router under clients that leave early: whether a client disconnects while the
router waits for the replica's headers, before the first byte of the body or mid-stream, the
replica's in-flight count (which the least-loaded policy reads) and the upstream stream go back to
zero, as the router's /metrics and the replica's own count of open streams show."""

import socket
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from fake_replica import FakeReplica
from openai import OpenAI

from minillm.bench.online import ServerProcess, free_port
from minillm.router.app import Router, build_router_app


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
    replica = FakeReplica(tokens=25, interval=0.2)
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


FAKE = str(Path(__file__).parent / "fake_replica.py")


def fake_replica(stack: ExitStack, *flags: str) -> tuple[str, ServerProcess]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, FAKE, str(port), *flags]
    return url, stack.enter_context(ServerProcess(cmd, f"{url}/v1", timeout=60))


def start_router(urls, **kwargs) -> tuple[Router, str, uvicorn.Server]:
    router = Router(urls, policy="round_robin", poll_interval=0.2, **kwargs)
    port = free_port()
    server = serve(build_router_app(router), port)
    return router, f"http://127.0.0.1:{port}", server


def wait_idle(router: Router, url: str):
    deadline = time.monotonic() + 10
    while router_in_flight(url):
        assert time.monotonic() < deadline, [r.in_flight for r in router.replicas]
        time.sleep(0.1)


def test_a_replica_killed_midstream_is_an_error_event_then_routed_around():
    with ExitStack() as stack:
        (a, pa), (b, _) = fake_replica(stack, "--interval", "0.2"), fake_replica(stack)
        router, url, server = start_router([a, b])
        stack.callback(setattr, server, "should_exit", True)
        client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
        stream = client.completions.create(model="m", prompt="hi", max_tokens=20, stream=True)
        got = []
        with pytest.raises(openai.APIError, match="failed midway"):
            for event in stream:
                got.append(event.choices[0].text)
                if len(got) == 3:
                    pa.proc.kill()  # round robin sent the first request to a
        assert len(got) >= 3
        assert not router.replicas[0].healthy  # marked dead at once, before the next poll
        for _ in range(3):  # every request now goes to b, streaming or not
            assert client.completions.create(model="m", prompt="x", max_tokens=5).choices
            events = client.completions.create(model="m", prompt="x", stream=True, max_tokens=5)
            assert sum(1 for _ in events) == 20
        wait_idle(router, url)


def test_a_replica_that_hangs_times_out():
    with ExitStack() as stack:
        a, _ = fake_replica(stack, "--hang-after", "2")
        router, url, server = start_router([a], read_timeout=1.0)
        stack.callback(setattr, server, "should_exit", True)
        client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
        start = time.monotonic()
        with pytest.raises(openai.APIError, match="failed midway"):
            for _ in client.completions.create(model="m", prompt="hi", stream=True):
                pass
        assert time.monotonic() - start < 20  # the read timeout, not the client's
        wait_idle(router, url)


def test_a_router_restart_while_replicas_serve():
    with ExitStack() as stack:
        a, _ = fake_replica(stack)
        router, url, server = start_router([a])
        client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
        assert client.completions.create(model="m", prompt="x").choices
        server.should_exit = True  # the router goes away...
        deadline = time.monotonic() + 10
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1)
            except httpx.TransportError:
                break
            assert time.monotonic() < deadline, "the router did not stop"
            time.sleep(0.1)
        with pytest.raises(openai.APIConnectionError):
            client.completions.create(model="m", prompt="x")
        port = int(url.rsplit(":", 1)[1])
        router2 = Router([a], policy="round_robin", poll_interval=0.2)
        server2 = serve(build_router_app(router2), port)  # the same address again
        stack.callback(setattr, server2, "should_exit", True)
        assert client.completions.create(model="m", prompt="x").choices
        assert sum(1 for _ in client.completions.create(model="m", prompt="x", stream=True)) == 20
