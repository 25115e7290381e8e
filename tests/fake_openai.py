"""A fake OpenAI-compatible HTTP server on loopback, for tests of the `openai` backend.

Real HTTP/1.1 over asyncio streams (keep-alive, Content-Length bodies), a listen backlog of
256. Each request takes the next mode from `script`, then `default`: "ok", "429" (with
Retry-After), "500", "hang" (never answers until the server closes), "malformed" (a 200
whose body is not JSON), "empty" (a 200 whose reply text is empty), "huge" (a 200 whose
reply text is `huge_chars` long, sent in chunks without a Content-Length and never held in
memory whole, so that only the client's side of it costs memory). An "ok" answer
reports `usage` (prompt tokens: the words of the prompt or messages; completion tokens: the
words of the reply); `delay_s` holds every answer back, and `capacity` serves at most that
many requests at a time (the rest wait), like a model server whose batch is full; while
`held` is clear, every answer waits for it (a test's hand on the server's progress). With
`GET /props` names its build as llama.cpp's server does (`build_info`, the replies'
`system_fingerprint`), and with `n_ctx` set its context window per slot. `POST /tokenize`
counts as llama.cpp's server does, one token per word of `content` (no mode taken, kept in
`tokenized`, not in `requests`, held with the rest); with `tokenizes` false it answers 404, as a
vLLM server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["FakeOpenAI", "open_fake_openai"]


class FakeOpenAI:
    def __init__(self, reply: str = "Aye, the forge is hot today.") -> None:
        self.reply = reply
        self.script: list[str] = []
        self.default = "ok"
        self.retry_after = "0.05"
        self.requests: list[dict[str, Any]] = []
        self.modes: list[str] = []
        self.port = 0
        self.usage: dict[str, Any] | None = None  # replaces the computed `usage` when set
        self.timings: dict[str, Any] | None = None  # llama.cpp's `timings` of a reply, when set
        self.delay_s = 0.0
        self.capacity: int | None = None
        self.held = asyncio.Event()
        self.held.set()
        self.huge_chars = 50 * 1024 * 1024
        self.n_ctx: int | None = None
        self.total_slots: int | None = None  # said in GET /props when set
        self.gets: list[str] = []  # the paths asked with GET (`requests` holds the POSTs)
        self.fingerprint = "fake-build-1"
        self.tokenizes = True
        self.tokenized: list[dict[str, Any]] = []  # the bodies of POST /tokenize
        self.counting = asyncio.Event()  # set at the first POST /tokenize
        self._last_prompt: list[str] = []
        self._busy: asyncio.Semaphore | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _next_mode(self) -> str:
        return self.script.pop(0) if self.script else self.default

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in lines[1:] if ":" in h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                await self._respond(writer, method, path, headers, body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection: the normal end of a keep-alive session
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _respond(
        self, writer: asyncio.StreamWriter, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> None:
        if method == "GET":
            await self._get(writer, path)
            return
        if path == "/tokenize":
            await self._tokenize(writer, json.loads(body))
            return
        mode = self._next_mode()
        self.modes.append(mode)
        request = json.loads(body) if body else {}
        self.requests.append({"method": method, "path": path, "headers": headers, "body": request})
        if mode == "hang":
            await asyncio.Event().wait()  # the subject: a server that never answers (the client's timeout ends it)
        await self.held.wait()
        if self.capacity is not None:
            self._busy = self._busy or asyncio.Semaphore(self.capacity)
            async with self._busy:
                await asyncio.sleep(self.delay_s)  # the subject: a slow server with `capacity` slots
        elif self.delay_s:
            await asyncio.sleep(self.delay_s)  # the subject: a slow server
        status, extra, payload = 200, {}, b""
        if mode == "huge":
            await self._send_huge(writer, path)
            return
        if mode in ("ok", "empty"):
            reply = self.reply if mode == "ok" else ""
            if path.endswith("/chat/completions"):
                choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": reply}}
            else:
                choice = {"index": 0, "text": reply}
            prompt = request.get("prompt") or " ".join(m.get("content", "") for m in request.get("messages", []))
            usage = self.usage if self.usage is not None else self._usage(prompt.split(), reply)
            answer = {
                "id": "cmpl-1", "model": request.get("model", ""), "system_fingerprint": self.fingerprint,
                "choices": [choice], "usage": usage,
            }
            payload = json.dumps(answer if self.timings is None else {**answer, "timings": self.timings}).encode()
        elif mode == "429":
            status, extra, payload = 429, {"Retry-After": self.retry_after}, b'{"error": "slow down"}'
        elif mode == "500":
            status, payload = 500, b'{"error": "boom"}'
        elif mode == "malformed":
            payload = b"{not json"
        else:
            raise AssertionError(f"unknown mode {mode!r}")
        await _send(writer, status, payload, extra)

    async def _tokenize(self, writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
        self.tokenized.append(request)
        self.counting.set()
        await self.held.wait()
        if not self.tokenizes:
            await _send(writer, 404, b'{"error": "not found"}')
            return
        await _send(writer, 200, json.dumps({"tokens": list(range(len(request["content"].split())))}).encode())

    def _usage(self, words: list[str], reply: str) -> dict[str, Any]:
        """Tokens are words; those at the start that the previous prompt had too count as cached."""
        cached = 0
        for mine, theirs in zip(words, self._last_prompt, strict=False):
            if mine != theirs:
                break
            cached += 1
        self._last_prompt = words
        return {
            "prompt_tokens": len(words), "completion_tokens": len(reply.split()),
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    async def _get(self, writer: asyncio.StreamWriter, path: str) -> None:
        self.gets.append(path)
        if path == "/props":
            props: dict[str, Any] = {"build_info": self.fingerprint}
            if self.total_slots is not None:
                props["total_slots"] = self.total_slots
            if self.n_ctx is not None:
                props["default_generation_settings"] = {"n_ctx": self.n_ctx}
            status, payload = 200, json.dumps(props).encode()
        else:
            status, payload = 404, b'{"error": "not found"}'
        await _send(writer, status, payload)

    async def _send_huge(self, writer: asyncio.StreamWriter, path: str) -> None:
        """A chunked 200 whose reply text is "Aye. " and `huge_chars` of "x", 1 MiB at a time."""
        if path.endswith("/chat/completions"):
            head, tail = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": "Aye. ', '"}}]}'
        else:
            head, tail = '{"choices": [{"index": 0, "text": "Aye. ', '"}]}'
        writer.write(b"HTTP/1.1 200 X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        block = b"x" * (1024 * 1024)
        writer.write(b"%x\r\n%s\r\n" % (len(head), head.encode()))
        left = self.huge_chars
        while left > 0:
            part = block if left >= len(block) else block[:left]
            left -= len(part)
            writer.write(b"%x\r\n" % len(part))
            writer.write(part)
            writer.write(b"\r\n")
            await writer.drain()
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail.encode()))
        await writer.drain()

    async def close_handlers(self) -> None:
        tasks = list(self._handlers)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _send(writer: asyncio.StreamWriter, status: int, payload: bytes, extra: dict[str, str] | None = None) -> None:
    head = [f"HTTP/1.1 {status} X", "Content-Type: application/json", f"Content-Length: {len(payload)}"]
    head += [f"{k}: {v}" for k, v in (extra or {}).items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    await writer.drain()


@contextlib.asynccontextmanager
async def open_fake_openai(reply: str = "Aye, the forge is hot today.") -> AsyncIterator[FakeOpenAI]:
    fake = FakeOpenAI(reply)
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0, backlog=256)
    fake.port = server.sockets[0].getsockname()[1]
    try:
        yield fake
    finally:
        server.close()
        await fake.close_handlers()
        await server.wait_closed()
