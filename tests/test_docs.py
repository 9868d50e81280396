"""The documentation: the site builds under ``mkdocs build --strict`` (a broken link, a missing anchor
or a page left out of the nav fails), every flag and override it names exists, and the README stays a
short front page (at most 250 lines, no commit hashes, no dated measurements: those live in docs/results/)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests import doc_flags

REPO = Path(__file__).resolve().parents[1]


def _pytest_flags(config: pytest.Config) -> frozenset[str]:
    parser = config._parser  # pytest's own parser, with every plugin's options and the project's (tests/tiers.py)
    options = list(parser._anonymous.options) + [o for group in parser._groups for o in group.options]
    return frozenset(name for option in options for name in option.names())


def test_site_builds_strict(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).with_name("mkdocs")
    assert mkdocs.exists(), "mkdocs is not installed: it is in the dev extra (bash scripts/setup)"
    proc = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    page = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "--max-turns" in page and "--grade-only" in page  # the generated sao-eval reference
    assert "rollout.stale_policy" in (tmp_path / "site" / "reference" / "configuration" / "index.html").read_text()


def test_every_flag_and_override_the_docs_name_exists(pytestconfig: pytest.Config) -> None:
    problems = doc_flags.check(doc_flags.documents(), _pytest_flags(pytestconfig))
    assert not problems, "\n".join(map(str, problems))


def test_the_check_finds_a_renamed_flag_or_key(pytestconfig: pytest.Config) -> None:
    """What a rename leaves behind in prose and in command lines is reported, file and line."""
    doc = REPO / "docs" / "index.md"
    text = ("```bash\n"
            "sao-eval arithmetic --max-turnz 5 --limit 3\n"
            "sao-train algo=grpoo optim.lrr=1 +env.kwargs.ops=x env.kwargs.difficulty=0.5 env.kwargs.images=M -m seed=1,2\n"
            "python benchmarks/war.py --armz x\n"
            "bash scripts/test --longg\n"
            "sao-model prepar smollm2-135m\n"
            "pytest --tierr long\n"
            "```\n"
            "Prose: `--max-turnz`, `optim.lrx=3`, `rollout.keep_kvv`, and fine ones: `algo=grpo`,\n"
            "`model.lora.rank=8`, `--max-turns`, `--network none`, `eval.jsonl`, `env.kwargs.anything=1`.\n")
    found = {(p.snippet.line, p.name) for p in doc_flags.check([doc], _pytest_flags(pytestconfig), {doc: text})}
    assert found == {(2, "--max-turnz"), (3, "algo=grpoo"), (3, "optim.lrr=1"), (3, "env.kwargs.images=M"), (4, "--armz"), (5, "--longg"),
                     (6, "prepar"), (7, "--tierr"), (9, "--max-turnz"), (9, "optim.lrx=3"), (9, "rollout.keep_kvv")}


def test_every_console_script_is_in_the_reference() -> None:
    scripts = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
    hook = doc_flags.hook()
    assert scripts == (set(hook.COMMANDS) | {hook.HYDRA_COMMAND}) - {c for c in hook.COMMANDS if " " in c}
    for command in hook.COMMANDS:
        assert f"<!-- cli: {command} -->" in (REPO / "docs" / "reference" / "cli.md").read_text()


def test_every_marker_expands() -> None:
    hook = doc_flags.hook()
    for page in (REPO / "docs").rglob("*.md"):
        left = re.findall(r"<!-- (?:cli|schema|train-groups)\b.*?-->", hook.expand(page.read_text()))
        assert not left, f"{page}: markers the hook does not know: {left}"


def test_readme_is_a_short_front_page() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    hashes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"\d", h) and re.search(r"[a-f]", h)]
    assert not hashes, f"commit hashes in README.md: {hashes}"
    dates = re.findall(r"\b20\d\d-\d\d-\d\d\b", text)
    assert not dates, f"dated measurements belong in docs/results/: {dates}"


@pytest.mark.parametrize("name", ["README.md", "AGENTS.md"])
def test_every_relative_link_of_the_front_pages_exists(name: str) -> None:
    """README.md and AGENTS.md are outside the site, so mkdocs does not check their links: this does."""
    text = (REPO / name).read_text()
    links = [link.split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in link]
    missing = [link for link in links if link and not (REPO / link).exists()]
    assert links and not missing, f"{name} links to files that do not exist: {missing}"
