"""``sao-proxy`` run alone in front of the fake server: it prints a session URL, serves an unchanged openai
SDK client there, and on SIGINT prints the session's counts."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import openai
import pytest

from sao.agents.testing.fake_server import FakeServer, Reply


@pytest.mark.slow
def test_sao_proxy_serves_a_session_and_reports_it_on_sigint(smollm2_dir):
    with FakeServer([Reply(text="Hello there.")]) as fake:
        proc = subprocess.Popen([sys.executable, "-m", "sao.agents.capture.cli", "--base-url", fake.base_url,
                                 "--model", "fake", "--tokenizer", str(smollm2_dir), "--route", "completions",
                                 "--temperature", "1.0", "--max-tokens", "64"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            url = proc.stdout.readline().strip()  # type: ignore[union-attr]
            assert url.startswith("http://127.0.0.1:") and url.endswith("/v1"), proc.stderr.read()  # type: ignore[union-attr]
            client = openai.OpenAI(base_url=url, api_key="any", max_retries=0)
            answer = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}],
                                                    temperature=0.2)
            assert answer.choices[0].message.content == "Hello there."
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["calls"], summary["pinned_calls"], summary["split"]) == (1, 1, 0)
    assert "session" in err and "pinned temperature" in err  # each call is logged
    sent = fake.requests[-1]
    assert sent["temperature"] == 1.0 and sent["top_k"] == -1 and isinstance(sent["prompt"][0], int)
