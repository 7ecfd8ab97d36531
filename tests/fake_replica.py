"""A stand-in for `minillm serve` in the router's fault tests: /health, /metrics and
/v1/completions in OpenAI's format, streamed (one token every `interval` seconds, `tokens` of
them) or not. It can wait `header_delay` before answering, or go silent after `hang_after`
tokens, and it counts its open streams. In-process (`FakeReplica(...).app`) or as a process:
`python fake_replica.py PORT [--tokens N] [--interval S] [--hang-after N]`."""

import argparse
import asyncio
import json

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse


def chunk(text: str, finish=None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    body = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m"}
    return f"data: {json.dumps({**body, 'choices': [choice]})}\n\n".encode()


class FakeReplica:
    def __init__(self, tokens: int = 20, interval: float = 0.1, hang_after: int | None = None):
        self.tokens, self.interval, self.hang_after = tokens, interval, hang_after
        self.header_delay, self.open_streams = 0.0, 0
        self.app = app = FastAPI()

        @app.get("/health")
        async def health():
            return {"status": "ok"}

        @app.get("/metrics")
        async def metrics():
            return PlainTextResponse("minillm_requests_running 0\n")

        @app.post("/v1/completions")
        async def completions(body: dict):
            await asyncio.sleep(self.header_delay)
            if body.get("stream"):
                self.open_streams += 1
                return StreamingResponse(self.events(), media_type="text/event-stream")
            choice = {"index": 0, "text": " tok" * self.tokens, "finish_reason": "length"}
            usage = {"prompt_tokens": 1, "completion_tokens": self.tokens}
            usage["total_tokens"] = self.tokens + 1
            reply = {"id": "c", "object": "text_completion", "created": 0, "model": "m"}
            return JSONResponse(
                {**reply, "choices": [{**choice, "logprobs": None}], "usage": usage}
            )

    async def events(self):
        try:
            for i in range(self.tokens):
                if i == self.hang_after:
                    await asyncio.sleep(3600)
                yield chunk(" tok", "length" if i == self.tokens - 1 else None)
                await asyncio.sleep(self.interval)
            yield b"data: [DONE]\n\n"
        finally:
            self.open_streams -= 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--hang-after", type=int, default=None)
    a = ap.parse_args()
    replica = FakeReplica(a.tokens, a.interval, a.hang_after)
    uvicorn.run(replica.app, port=a.port, log_level="warning")
