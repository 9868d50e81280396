"""A scripted OpenAI-compatible completion server: real HTTP on localhost, for tests.

Each request to ``/v1/completions`` or ``/v1/chat/completions`` takes the next :class:`Reply` of
the script (or asks the ``responder`` when the script is empty). A reply can answer with text,
fail with an HTTP status, wait (to trip a client timeout), send a malformed body, or drop the
connection. The server tokenizes with the :class:`~sao.agents.chat.rendering.ByteTokenizer` by default,
echoes ``prompt_token_ids`` and ``token_ids`` on ``/v1/completions`` as vLLM does with
``return_token_ids``, and records every request it saw::

    with FakeServer([Reply(status=503), Reply(text="\\\\boxed{4}")]) as server:
        client = OpenAICompletionClient(server.base_url, "fake")

``/v1/chat/completions`` answers as hosted APIs do: text, native ``tool_calls`` (a reply's
``tool_calls``) and ``usage`` (unless ``usage=False``), and never token ids. ``chat_only=True``
makes the server a hosted chat model: ``/v1/completions`` answers 404 without taking a reply.
``metrics`` (a callable returning Prometheus text) serves ``GET /metrics`` as vLLM does (404 without);
``max_model_len`` is listed in ``GET /v1/models``' model card, as vLLM lists its context.
:meth:`FakeServer.abort` ends every request still waiting out its reply's ``delay_s`` as vLLM's
``/pause?mode=abort`` does: at once, ``finish_reason`` "abort", with the tokens "generated so far" (the
reply's ``partial``, default half of them) and their log-probs.
The responder of a chat request gets the messages rendered as ChatML text (tool calls included).
Note that ``sao-eval``'s ``--endpoint-mode auto`` probe is a ``/v1/completions`` request: on a
server that is not ``chat_only`` it takes a reply like any other request.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..chat import ByteTokenizer


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
    tool_calls: tuple[dict[str, Any], ...] = ()  # chat route: native tool calls, sent as given
    usage: bool = True  # chat route: report usage
    # token route: its weight_versions spans as given (version, start, end); None: one span over every
    # token labelled `weight_version` (vLLM's "default" when that is None)
    version_spans: tuple[tuple[str, int, int], ...] | None = None
    partial: int | None = None  # tokens it answers with when FakeServer.abort() ends it; None: half of them


@dataclass
class FakeServer:
    script: Iterable[Reply] = ()
    responder: Callable[[dict[str, Any], str], Reply] | None = None  # (request, decoded prompt) -> Reply
    tokenizer: Any = field(default_factory=ByteTokenizer)
    model: str = "fake"
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0  # 0: a free one (kept across kill() and restart())
    chat_only: bool = False  # /v1/completions answers 404, as for a hosted chat model
    metrics: Callable[[], str] | None = None  # GET /metrics answers its Prometheus text; None: 404
    max_model_len: int | None = None  # listed in /v1/models' model card as vLLM does; None: not listed

    def __post_init__(self) -> None:
        self._script = deque(self.script)
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._life = threading.RLock()  # start, stop, kill and restart may come from several threads
        self.dead = False  # killed: requests in flight get their connection closed, new ones are refused
        self._aborts = threading.Condition()
        self._abort_count = 0
        self.aborted = 0  # requests that abort() ended

    @property
    def root_url(self) -> str:
        assert self.port, "server not started"
        return f"http://127.0.0.1:{self.port}"

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

    def abort(self) -> None:
        """End every request waiting out its delay, as vLLM's pause in "abort" mode does (module doc)."""
        with self._aborts:
            self._abort_count += 1
            self._aborts.notify_all()

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds`` (a reply's delay); True when :meth:`abort` ended the wait first."""
        deadline = time.monotonic() + seconds
        with self._aborts:
            seen = self._abort_count
            while self._abort_count == seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._aborts.wait(left)
            self.aborted += 1
            return True

    def next_reply(self, request: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(request)
            if self._script:
                return self._script.popleft()
        return self.responder(request, self.prompt_text(request)) if self.responder else Reply(text="I don't know.")

    def prompt_text(self, request: dict[str, Any]) -> str:
        """The request's prompt as text: token ids decoded, a text prompt as is, chat messages as ChatML."""
        if "messages" in request:
            return render_chat(request["messages"])
        prompt = request.get("prompt") or []
        return prompt if isinstance(prompt, str) else self.tokenizer.decode(prompt, skip_special_tokens=False)

    def completion_body(self, request: dict[str, Any], reply: Reply) -> dict[str, Any]:
        prompt = request.get("prompt") or []
        prompt_ids = list(self.tokenizer.encode(prompt)) if isinstance(prompt, str) else prompt
        ids = list(self.tokenizer.encode(reply.text))
        limit = int(request.get("max_tokens") or 16)
        finish = reply.finish_reason
        if finish == "stop" and reply.end_with_eos:
            ids.append(self.tokenizer.eos_token_id)
        if finish == "abort":
            ids = ids[:len(ids) // 2 if reply.partial is None else reply.partial]
        if len(ids) > limit:
            ids, finish = ids[:limit], "length"
        choice: dict[str, Any] = {
            "index": 0,
            "text": self.tokenizer.decode(ids, skip_special_tokens=True),
            "finish_reason": finish,
            "token_ids": ids,
            "prompt_token_ids": prompt_ids,
            "logprobs": {"token_logprobs": [reply.logprob] * len(ids), "tokens": None, "top_logprobs": None,
                         "text_offset": None},
        }
        for key in reply.omit:
            choice.pop(key, None)
        body: dict[str, Any] = {"id": "cmpl-fake", "object": "text_completion", "created": int(time.time()),
                                "model": self.model, "choices": [choice],
                                "usage": {"prompt_tokens": len(prompt_ids),
                                          "completion_tokens": len(ids),
                                          "total_tokens": len(prompt_ids) + len(ids)}}
        if reply.weight_version is not None:
            body["weight_version"] = reply.weight_version
        return body

    def generate_body(self, request: dict[str, Any], reply: Reply) -> dict[str, Any]:
        """A token-route answer (``/inference/v1/generate``): the same tokens as :meth:`completion_body`'s,
        log-probs as ``content`` entries, and ``weight_versions`` spans."""
        params = request.get("sampling_params") or {}
        body = self.completion_body({"prompt": request.get("token_ids") or [], "max_tokens": params.get("max_tokens")},
                                    reply)
        choice = body["choices"][0]
        ids = choice.get("token_ids") or []
        spans = reply.version_spans
        if spans is None:
            spans = ((reply.weight_version or "default", 0, len(ids)),)
        choice["logprobs"] = {"content": [{"token_id": t, "logprob": reply.logprob} for t in ids]}
        choice["weight_versions"] = [{"version": v, "start": a, "end": b} for v, a, b in spans]
        body["prompt_token_ids"] = choice.pop("prompt_token_ids")
        return body

    def chat_body(self, request: dict[str, Any], reply: Reply) -> dict[str, Any]:
        """A ``/v1/chat/completions`` answer: no token ids; a reply longer than ``max_tokens`` is cut
        (``finish_reason`` "length", its tool calls dropped). A request without ``max_tokens`` is not cut:
        chat servers bound it by the model's context only."""
        ids = list(self.tokenizer.encode(reply.text))
        calls = list(reply.tool_calls)
        limit = request.get("max_tokens") or request.get("max_completion_tokens")
        finish = "tool_calls" if calls else reply.finish_reason
        if limit is not None and len(ids) > int(limit):
            ids, calls, finish = ids[:int(limit)], [], "length"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            message["tool_calls"] = calls
        body: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                                "model": self.model,
                                "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
        if reply.usage:
            n_prompt = len(self.tokenizer.encode(render_chat(request.get("messages") or [])))
            n_out = len(ids) + (len(self.tokenizer.encode(json.dumps(calls))) if calls else 0)
            body["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
        if reply.weight_version is not None:
            body["weight_version"] = reply.weight_version
        return body


def render_chat(messages: list[dict[str, Any]]) -> str:
    """ChatML text of chat ``messages``, tool calls as Hermes ``<tool_call>`` blocks, ending with the
    assistant header."""
    text = ""
    for m in messages:
        calls = "".join(f"<tool_call>{json.dumps(c.get('function', c))}</tool_call>" for c in m.get("tool_calls") or ())
        text += f"<|im_start|>{m.get('role')}\n{m.get('content') or ''}{calls}<|im_end|>\n"
    return text + "<|im_start|>assistant\n"


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
        elif self.path == "/metrics" and self.fake.metrics is not None:
            self._send(200, self.fake.metrics().encode(), "text/plain; version=0.0.4")
        elif self.path == "/v1/models":
            card: dict[str, Any] = {"id": self.fake.model, "object": "model"}
            if self.fake.max_model_len is not None:
                card["max_model_len"] = self.fake.max_model_len
            self._send(200, json.dumps({"object": "list", "data": [card]}).encode())
        else:
            self._send(404, b'{"error": {"message": "not found"}}')

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        chat = self.path == "/v1/chat/completions"
        generate = self.path == "/inference/v1/generate"
        if self.path == "/v1/completions" and self.fake.chat_only:
            self._send(404, json.dumps({"error": {"message": f"{self.fake.model} is a chat model and not supported "
                                                            "in the v1/completions endpoint", "code": 404}}).encode())
            return
        if not chat and not generate and self.path != "/v1/completions":
            self._send(404, b'{"error": {"message": "not found"}}')
            return
        reply = self.fake.next_reply(request)
        if reply.delay_s and self.fake.wait(reply.delay_s):
            reply = replace(reply, finish_reason="abort")
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
            body = (self.fake.chat_body(request, reply) if chat else self.fake.generate_body(request, reply) if generate
                    else self.fake.completion_body(request, reply))
            self._send(200, json.dumps(body).encode())
