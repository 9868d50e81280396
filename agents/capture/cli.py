"""``sao-proxy``: the capture proxy alone, for debugging an agent against it.

    sao-proxy --base-url http://127.0.0.1:8000/v1 --model smollm2-135m            # vLLM's token route
    sao-proxy --base-url URL --model NAME --route completions                       # /v1/completions
    sao-proxy --base-url https://api.example/v1 --model NAME --route chat           # a hosted chat endpoint
    sao-proxy ... --temperature 1.0                                                  # training's pinned rule

It opens ``--sessions`` sessions, prints their base URLs (one a line), logs each call, and on Ctrl-C (or
SIGTERM) prints each session's calls and merge/split counts as JSON. Without ``--temperature`` the
agent's own sampling settings pass through (evaluation); with it they are pinned (training), which a chat
route refuses. The token routes render with the model's tokenizer (``--tokenizer``, default the model's
name: a prepared alias, a local directory or a Hugging Face id) and parse tool calls with vLLM's parser
``--tool-parser``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from collections.abc import Sequence
from dataclasses import asdict

from ..clients.endpoint import Endpoint, open_endpoint
from .proxy import CaptureProxy
from .sampling import AgentSampling, PinnedSampling, SamplingRule
from .upstream import TextUpstream, TokenUpstream, Upstream

ROUTES = ("generate", "completions", "chat")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sao-proxy", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True, help="the engine's OpenAI base URL (ending in /v1)")
    p.add_argument("--model", required=True, help="the served model's name")
    p.add_argument("--api-key", default=None, help="the engine's API key, if it needs one")
    p.add_argument("--route", choices=ROUTES, default="generate",
                   help="generate: vLLM's token route (per-token versions; vLLM started with its scale-out flag); "
                        "completions: /v1/completions on token ids; chat: a hosted chat endpoint (text only)")
    p.add_argument("--tokenizer", default=None, help="where the tokenizer is (default: the model's name)")
    p.add_argument("--tool-parser", default="hermes", help="vLLM's tool parser for the model family")
    p.add_argument("--temperature", type=float, default=None, help="pin sampling to this temperature (training)")
    p.add_argument("--max-tokens", type=int, default=None, help="the most tokens one call may sample")
    p.add_argument("--sessions", type=int, default=1, help="how many sessions to open")
    p.add_argument("--port", type=int, default=0, help="the proxy's port on 127.0.0.1 (0: a free one)")
    return p


def rule_for(args: argparse.Namespace) -> SamplingRule:
    if args.temperature is None:
        return AgentSampling(max_tokens=args.max_tokens)
    return PinnedSampling(temperature=args.temperature, max_tokens=args.max_tokens)


def upstream_for(route: str, endpoint: Endpoint, tool_parser: str) -> Upstream:
    """The upstream of ``route`` on ``endpoint`` (a chat-mode endpoint for "chat")."""
    from ..clients.chat import OpenAIChatClient

    if route == "chat":
        return TextUpstream(OpenAIChatClient(endpoint.base_url, endpoint.model, api_key=endpoint.api_key),
                            endpoint.model)
    from transformers import AutoTokenizer

    from ..clients.completions import OpenAICompletionClient
    from ..clients.generate import GenerateClient, generate_base_url
    from ..loop.episodes import Renderers
    from .tool_calls import default_tool_parser

    tokenizer = AutoTokenizer.from_pretrained(endpoint.tokenizer)
    root = endpoint.base_url.removesuffix("/v1")
    client = (GenerateClient(generate_base_url(root), endpoint.model, api_key=endpoint.api_key) if route == "generate"
              else OpenAICompletionClient(endpoint.base_url, endpoint.model, api_key=endpoint.api_key))
    return TokenUpstream(client, Renderers(tokenizer), default_tool_parser(tokenizer, tool_parser), endpoint.model,
                         max_model_len=endpoint.max_model_len)


async def serve(upstream: Upstream, rule: SamplingRule, sessions: int, port: int) -> None:
    """Open the sessions, print their URLs, wait for SIGINT or SIGTERM, then print each one's summary."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with CaptureProxy(port=port) as proxy:
        opened = [proxy.session(upstream, rule) for _ in range(sessions)]
        for session in opened:
            print(session.base_url, flush=True)
        await stop.wait()
        for session in opened:
            stats = session.assemble().stats
            print(json.dumps({"session": session.id, **asdict(stats)}), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    rule = rule_for(args)
    if rule.trains and args.route == "chat":
        build_parser().error("--temperature pins sampling for training, which needs token ids: not on --route chat")
    mode = "chat" if args.route == "chat" else "tokens"
    with open_endpoint(args.model, base_url=args.base_url, api_key=args.api_key, tokenizer=args.tokenizer,
                       mode=mode) as endpoint:
        asyncio.run(serve(upstream_for(args.route, endpoint, args.tool_parser), rule, args.sessions, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
