"""A stand-in for `minillm serve` in the router's fault tests: /health, /metrics and a streaming
/v1/completions in OpenAI's format (one token every `--interval` seconds, `--tokens` of them), or
after `--hang-after` tokens silence forever. Run as `python fake_replica.py PORT [options]`."""

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


def build(tokens: int, interval: float, hang_after: int | None) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse("minillm_requests_running 0\n")

    @app.post("/v1/completions")
    async def completions(body: dict):
        if not body.get("stream"):
            text = " ".join(["tok"] * tokens)
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
            return JSONResponse(
                {
                    "id": "c",
                    "object": "text_completion",
                    "created": 0,
                    "model": "m",
                    "choices": [choice],
                    "usage": usage,
                }
            )

        async def events():
            for i in range(tokens):
                if hang_after is not None and i == hang_after:
                    await asyncio.sleep(3600)
                yield chunk(" tok", "length" if i == tokens - 1 else None)
                await asyncio.sleep(interval)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--hang-after", type=int, default=None)
    a = ap.parse_args()
    uvicorn.run(build(a.tokens, a.interval, a.hang_after), port=a.port, log_level="warning")
