"""A scripted OpenAI-compatible completion server: real HTTP on localhost, for tests.

Each request to ``/v1/completions`` takes the next :class:`Reply` of the script (or asks the
``responder`` when the script is empty). A reply can answer with text, fail with an HTTP status,
wait (to trip a client timeout), send a malformed body, or drop the connection. The server
tokenizes with the :class:`~sao.agents.chat.ByteTokenizer` by default, echoes ``prompt_token_ids``
and ``token_ids`` as vLLM does with ``return_token_ids``, and records every request it saw::

    with FakeServer([Reply(status=503), Reply(text="\\\\boxed{4}")]) as server:
        client = OpenAICompletionClient(server.base_url, "fake")
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .chat import ByteTokenizer


@dataclass(frozen=True)
class Reply:
    text: str = ""
    finish_reason: str = "stop"
    status: int = 200  # != 200: answer with this status and `error` as the message
    error: str = "scripted failure"
    delay_s: float = 0.0  # sleep before answering
    raw: bytes | None = None  # send these bytes as the body, as-is (malformed responses)
    drop: bool = False  # close the connection without answering
    logprob: float = -0.5  # the log-prob reported for every token
    omit: tuple[str, ...] = ()  # choice fields to leave out ("token_ids", "logprobs")
    weight_version: str | None = None
    end_with_eos: bool = True  # append the EOS token when finish_reason is "stop"


@dataclass
class FakeServer:
    script: Iterable[Reply] = ()
    responder: Callable[[dict[str, Any], str], Reply] | None = None  # (request, decoded prompt) -> Reply
    tokenizer: Any = field(default_factory=ByteTokenizer)
    model: str = "fake"
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0  # 0: a free one (kept across kill() and restart())

    def __post_init__(self) -> None:
        self._script = deque(self.script)
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._life = threading.RLock()  # start, stop, kill and restart may come from several threads
        self.dead = False  # killed: requests in flight get their connection closed, new ones are refused

    @property
    def base_url(self) -> str:
        assert self.port, "server not started"
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakeServer:
        with self._life:
            handler = type("Handler", (_Handler,), {"fake": self})
            server_cls = type("Server", (ThreadingHTTPServer,), {"request_queue_size": 256, "allow_reuse_address": True})
            self._httpd = server_cls(("127.0.0.1", self.port), handler)
            self.port = self._httpd.server_address[1]
            self._httpd.daemon_threads = True
            self.dead = False
            threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
            return self

    def __exit__(self, *exc: Any) -> None:
        with self._life:
            if self._httpd is not None:
                self._httpd.shutdown()
                self._httpd.server_close()
                self._httpd = None

    def kill(self) -> None:
        """Die like a crashed engine: stop listening, drop the requests in flight without an answer."""
        with self._life:
            self.dead = True
            self.__exit__()

    def restart(self) -> None:
        """Come back on the same port (after :meth:`kill`)."""
        with self._life:
            self.__exit__()
            self.__enter__()

    def next_reply(self, request: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self._script:
                return self._script.popleft()
        prompt = self.tokenizer.decode(request.get("prompt") or [], skip_special_tokens=False)
        return self.responder(request, prompt) if self.responder else Reply(text="I don't know.")

    def completion_body(self, request: dict[str, Any], reply: Reply) -> dict[str, Any]:
        ids = list(self.tokenizer.encode(reply.text))
        limit = int(request.get("max_tokens") or 16)
        finish = reply.finish_reason
        if finish == "stop" and reply.end_with_eos:
            ids.append(self.tokenizer.eos_token_id)
        if len(ids) > limit:
            ids, finish = ids[:limit], "length"
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.tokenizer.decode(ids, skip_special_tokens=True),
            "finish_reason": finish,
            "token_ids": ids,
            "prompt_token_ids": request.get("prompt"),
            "logprobs": {"token_logprobs": [reply.logprob] * len(ids), "tokens": None, "top_logprobs": None,
                         "text_offset": None},
        }
        for key in reply.omit:
            choice.pop(key, None)
        body: dict[str, Any] = {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()),
                                "model": self.model, "choices": [choice],
                                "usage": {"prompt_tokens": len(request.get("prompt") or []),
                                          "completion_tokens": len(ids),
                                          "total_tokens": len(request.get("prompt") or []) + len(ids)}}
        if reply.weight_version is not None:
            body["weight_version"] = reply.weight_version
        return body


class _Handler(BaseHTTPRequestHandler):
    fake: FakeServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path in ("/health", "/v1/health"):
            self._send(200, b"{}")
        elif self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": self.fake.model, "object": "model"}]}).encode())
        else:
            self._send(404, b'{"error": {"message": "not found"}}')

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        if self.path != "/v1/completions":
            self._send(404, b'{"error": {"message": "not found"}}')
            return
        reply = self.fake.next_reply(request)
        if reply.delay_s:
            time.sleep(reply.delay_s)
        if reply.drop or self.fake.dead:
            self.close_connection = True
            self.connection.close()
            return
        if reply.raw is not None:
            self._send(reply.status, reply.raw)
        elif reply.status != 200:
            body = {"error": {"message": reply.error, "type": "BadRequestError", "code": reply.status}}
            self._send(reply.status, json.dumps(body).encode())
        else:
            self._send(200, json.dumps(self.fake.completion_body(request, reply)).encode())
