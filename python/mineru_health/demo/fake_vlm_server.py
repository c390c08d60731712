"""A tiny OpenAI-compatible server that lets MinerU's ``vlm-http-client`` backend finish a parse.

    python -m mineru_health.demo.fake_vlm_server --host 127.0.0.1 --port 30000

It answers what ``mineru_vl_utils``' HTTP client asks for: ``GET /v1/models``
(one model, whose id the client adopts) and ``POST /v1/chat/completions``.
Every completion is an empty ``stop`` answer, which MinerU reads as a page
without layout blocks: the parse completes with empty content. ``GET /health``
answers 200 for test harnesses. For tests and demos only; it never loads a
model.

A slow engine is a ``server_url`` ending in ``/delay/<ms>/`` (the trailing
slash makes MinerU's client keep the path): every completion under that prefix
answers after ``<ms>`` milliseconds (at most 60 s). Under ``/serial/<ms>/``
completions are answered one at a time, each after ``<ms>``: a steady trickle
of progress, however many the client sends at once. Under ``/tarpit/<ms>/``
the model listing too answers only after ``<ms>`` (a server that accepts the
connection and then says nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from typing import Any

from fastapi import FastAPI, Request

__all__ = ["MODEL_ID", "create_app", "main"]

MODEL_ID = "mineru-health-fake-vlm"


def create_app() -> FastAPI:
    app = FastAPI(title="mineru-health fake VLM server", docs_url=None, redoc_url=None)
    counter = itertools.count(1)
    app.state.completions = 0
    one_at_a_time = asyncio.Lock()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    @app.get("/delay/{delay_ms}/v1/models")
    @app.get("/serial/{delay_ms}/v1/models")
    async def models(delay_ms: int = 0) -> dict[str, Any]:
        return model_list()

    @app.get("/tarpit/{delay_ms}/v1/models")
    async def slow_models(delay_ms: int) -> dict[str, Any]:
        await asyncio.sleep(min(delay_ms, 60_000) / 1000)
        return model_list()

    def model_list() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "mineru-health"}
            ],
        }

    @app.post("/serial/{delay_ms}/v1/chat/completions")
    async def serial_completions(request: Request, delay_ms: int) -> dict[str, Any]:
        async with one_at_a_time:
            return await chat_completions(request, delay_ms)

    @app.post("/v1/chat/completions")
    @app.post("/delay/{delay_ms}/v1/chat/completions")
    @app.post("/tarpit/{delay_ms}/v1/chat/completions")
    async def chat_completions(request: Request, delay_ms: int = 0) -> dict[str, Any]:
        body = await request.json()
        if delay_ms > 0:
            await asyncio.sleep(min(delay_ms, 60_000) / 1000)
        number = next(counter)
        app.state.completions = number
        return {
            "id": f"chatcmpl-fake-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", MODEL_ID) if isinstance(body, dict) else MODEL_ID,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": ""},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mineru_health.demo.fake_vlm_server",
        description="Fake OpenAI-compatible VLM server for MinerU's vlm-http-client backend "
        "(tests and demos; answers every page with an empty layout).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=30000, help="port (default 30000)")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level")
    args = parser.parse_args(argv)

    import uvicorn

    uvicorn.run(create_app(), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
