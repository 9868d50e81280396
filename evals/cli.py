"""``sao-eval BENCHMARK``: evaluate a model on a benchmark (thin entry point over :mod:`.runner`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from sao.agents import AgentError, Trajectory
from sao.agents.engine import SPECULATIVE_METHODS, EngineRestartsExhausted, SpeculativeConfig, parse_schedule
from sao.agents.interrupts import interrupt_exit_code, interrupt_name, sigterm_as_interrupt
from sao.envs import EnvError, entries
from sao.envs.cli import env_args

from .capture_counts import capture_rows
from .live import Board, BoardProgress
from .runner import EvalConfig, EvalError, cut_warning, evaluate, prepare_images
from .selection import parse_instance_ids, parse_slice
from .swe_outputs import patch_benchmark

console = Console(stderr=True)


def budgets_epilog() -> str:
    """The help's table of each benchmark's budgets (sao.envs.budgets), from the registry."""
    rows = "\n".join(f"  {name}: {entry.episode_budgets().describe()}" for name, entry in entries().items())
    head = textwrap.fill("Budgets by benchmark: --max-steps, --max-turns, --max-tokens, --max-tokens-per-turn and "
                         "--temperature default to them, and a flag overrides. No token budget: only the model's "
                         "context bounds the episode.", 78, break_on_hyphens=False)
    tail = textwrap.fill("With no --base-url, the model is served by a local vLLM started for this run, with the "
                         "model's own context window unless --max-model-len.", 78, break_on_hyphens=False)
    return f"{head}\n{rows}\n\n{tail}"


def plugins_listed() -> str:
    """The agent plug-ins installed, for the help (sao.agents.external.registry)."""
    from sao.agents.external.registry import plugins

    return "installed: " + (", ".join(plugins()) or "none")


def build_parser() -> argparse.ArgumentParser:
    names = ", ".join(sorted(entries()))
    p = argparse.ArgumentParser(
        prog="sao-eval",
        description=f"Evaluate a model on a benchmark. Benchmarks: {names}.",
        epilog=budgets_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("benchmark", help=f"benchmark name ({names}) or gymnasium id")
    p.add_argument("--agent", default="llm", metavar="NAME",
                   help="who acts: the model (llm, default); a scripted baseline of the environment: gold "
                        "(the reference solution through the real tools) or empty (no change); or an agent "
                        f"plug-in of the sao.agents entry-point group ({plugins_listed()}), run unchanged in a "
                        "subprocess per episode against the model's endpoint, what it returns graded by the "
                        "environment")
    p.add_argument("--agent-timeout", type=float, metavar="S",
                   help="an agent plug-in's wall time per episode, in seconds; past it the agent is killed with "
                        "every process it started and its containers, and the episode is a failed one "
                        "(agent_timeout) (default 3600 for the SWE benchmarks, 600 for the others)")
    p.add_argument("--agent-steps", type=int, metavar="N",
                   help="the most model calls an agent plug-in is asked to make per episode (its AgentTask's "
                        "step_limit; default: the agent's own)")
    p.add_argument("--model", default="smollm2-135m",
                   help="model alias (see `sao-model list`), local checkpoint directory, or Hugging Face id; "
                        "with --base-url, the served model name (default: smollm2-135m)")
    p.add_argument("--base-url", help="use this OpenAI-compatible endpoint (e.g. http://host:8000/v1) instead of a local vLLM")
    p.add_argument("--api-key", help="API key for --base-url")
    p.add_argument("--tokenizer", help="tokenizer directory or id (default: the model; not used in chat mode)")
    p.add_argument("--endpoint-mode", choices=["auto", "tokens", "chat"], default="auto",
                   help="how to talk to --base-url: tokens (token ids in and out on /v1/completions, as vLLM "
                        "serves; needs the tokenizer; trajectories are trainable), chat (text on "
                        "/v1/chat/completions with native tool calls, as hosted APIs serve; no tokenizer; "
                        "trajectories are text only, not trainable), or auto (default: probe the endpoint once "
                        "and use chat when it returns no token ids). A local vLLM always runs in tokens mode")
    p.add_argument("--data", help="local dataset file (jsonl, json, csv, parquet) or URL instead of the hub default")
    p.add_argument("--split", metavar="NAME",
                   help="the dataset split the environment loads (SWE-bench and math benchmarks from the hub: "
                        "default test; arithmetic: all, train or test); refused for an environment that takes "
                        "none, and with --env-arg split=...")
    p.add_argument("--samples", type=int, default=1,
                   help="samples per task (default 1); SWE: more than one writes each sample's predictions and "
                        "run report apart (preds.sampleS.json, predictions.sampleS.jsonl, report.sampleS.json, "
                        "S = 0..N-1, as the trajectories' 'sample') instead of preds.json, predictions.jsonl and "
                        "report.json: a predictions file holds one prediction per instance")
    p.add_argument("--instance-ids", metavar="ID,ID,...|FILE",
                   help="only these tasks: ids separated by commas, or, when the value is an existing file, that "
                        "file's ids, one a line (# comments skipped); they keep the benchmark's order. An id "
                        "the benchmark (with --grade-only: the predictions) lacks is an error. Selection applies "
                        "--instance-ids, --filter, --shuffle, --slice, then --limit, in that order")
    p.add_argument("--filter", metavar="REGEX",
                   help="only the tasks whose id this regular expression matches (Python's re.search, e.g. "
                        "'^django__' or 'sympy|astropy'); matching none is an error")
    p.add_argument("--shuffle", action="store_true",
                   help="shuffle the selected tasks, by --seed (the same order every run with that seed), "
                        "before --slice and --limit: --shuffle --limit 50 is a seeded random sample of 50")
    p.add_argument("--slice", metavar="START:END",
                   help="tasks START to END-1 of the list after --instance-ids, --filter and --shuffle, as "
                        "Python slices it (10:20, :50; either side may be left out; a negative START needs '=': "
                        "--slice=-10:); with --limit, the slice is taken first, then its first N. Leaving nothing "
                        "is an error")
    p.add_argument("--limit", type=int,
                   help="only the first N tasks, after the other selection flags (arithmetic, being endless, "
                        "defaults to 100, and selects from its first max(100, N, --slice END) tasks). Sampling "
                        "seeds follow each task's id, so a task keeps its seed under any selection")
    p.add_argument("--concurrency", type=int, default=None,
                   help="episodes in flight (default 32; for SWE benchmarks, whose episodes each hold a container, "
                        "what this machine holds: 2 per core, 1 per 2 GB of available memory)")
    p.add_argument("--temperature", type=float,
                   help="sampling temperature (default: the benchmark's, 1.0 for the built-ins; table below)")
    p.add_argument("--max-tokens", type=int,
                   help="generated tokens per episode, all turns together (default: the benchmark's budget; the "
                        "built-ins have none: only the context bounds the episode)")
    p.add_argument("--max-tokens-per-turn", type=int,
                   help="generated tokens per model call at most (default: the benchmark's; the built-ins have "
                        "none: whatever the budget and the context leave); for an agent plug-in, the bound of a "
                        "call that sets no max_tokens of its own")
    p.add_argument("--max-turns", type=int,
                   help="model calls per episode (default: the benchmark's: 300 for swe-bench-*, 50 for the math "
                        "benchmarks as in the paper; table below)")
    p.add_argument("--tools", choices=["python"], help="offer the model a tool (math benchmarks: python)")
    p.add_argument("--sandbox", choices=["local", "docker"],
                   help="where tool code runs: local (bubblewrap when installed; default) or docker")
    p.add_argument("--max-model-len", type=int,
                   help="context window of a local engine (default: the model's own, max_position_embeddings of "
                        "its config.json); with --base-url, used when the server reports none")
    p.add_argument("--seed", type=int, default=0,
                   help="seed for sampling, per episode derived from it, the task id and the sample; and for "
                        "--shuffle (default 0)")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds (default 600)")
    p.add_argument("--max-restarts", type=int, default=3,
                   help="restarts of the local vLLM when it dies mid-run; the episodes it cut run again (default 3; "
                        "with --replicas, per replica)")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument for the environment, value parsed as JSON when it can be "
                        "(e.g. --env-arg difficulty=0.5); repeatable")
    p.add_argument("--speculative", choices=list(SPECULATIVE_METHODS), default="none",
                   help="speculative decoding on the local vLLM: none (default) or suffix (SuffixDecoding: drafts "
                        "from earlier responses and the prompt, verified by the model; the summary reports "
                        "spec_acceptance and prefix_cache_hit_rate)")
    p.add_argument("--spec-tokens", type=int, help="suffix: most draft tokens a step (default 24)")
    p.add_argument("--spec-schedule", type=_schedule, default=(), metavar="FIRST-LAST:TOKENS,...",
                   help="suffix, load-aware: draft tokens by requests running, e.g. 1-4:24,5-:0 (24 while at most 4 "
                        "run, none above; benchmarks/war.py prints a calibrated one)")
    p.add_argument("--replicas", type=int, default=1,
                   help="local vLLM engines to start (default 1); with more than one, each request is placed by "
                        "--router, a replica that dies has its requests sent to the others, and the summary "
                        "reports the prefix-cache hit rate summed over the replicas")
    p.add_argument("--router", choices=["cache_aware", "round_robin"], default="cache_aware",
                   help="with --replicas: cache_aware (default: later turns of an episode where its prefix is "
                        "cached, new episodes to the least loaded replica) or round_robin")
    p.add_argument("--output", type=Path, help="output folder (default runs/eval/BENCHMARK-TIMESTAMP)")
    p.add_argument("--resume", action="store_true", help="continue the run in --output, skipping finished episodes")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    # the SWE benchmarks' options; SWE_FLAGS maps those of --pull-timeout on to the environment's arguments
    g = p.add_argument_group("SWE-bench", textwrap.fill(
        "For the SWE benchmarks (swe-bench-verified, swe-bench-lite, swe-bench, swe-local). A flag that sets a "
        "keyword argument of the environment (named in its help) is refused together with --env-arg for that "
        "argument; --pull-timeout and the flags after it are refused for any other benchmark.",
        76, break_on_hyphens=False))
    g.add_argument("--max-steps", type=int, metavar="N",
                   help="tool steps before the episode is cut and graded (default: the benchmark's: 300, "
                        "the paper's, for swe-bench-*; 50 for swe-local; max_steps)")
    g.add_argument("--image-map", type=Path, metavar="FILE",
                   help="JSON file mapping instance_id to a Docker image, the only image tried for "
                        "that instance (images)")
    g.add_argument("--grade-only", type=Path, metavar="PREDICTIONS",
                   help="grade given patches instead of running agents, from a predictions file in swebench's "
                        "formats: jsonl (instance_id, model_patch on each line), a JSON list of such objects, or "
                        "preds.json's object keyed by instance_id")
    g.add_argument("--no-autosubmit", dest="autosubmit", action="store_const", const=False, default=None,
                   help="score an episode that ends without submit (cut by --max-turns, --max-tokens, the "
                        "context, --max-steps, or format errors) as an empty patch, as mini-swe-agent does. By "
                        "default its working tree's diff is graded (autosubmit, as SWE-agent does). The "
                        "environment's autosubmit=False (sao-train: +env.kwargs.autosubmit=false)")
    g.add_argument("--pull-timeout", type=float, metavar="S",
                   help="give up pulling an image after S seconds without progress (default 30; the environment's "
                        "pull_timeout_s)")
    g.add_argument("--pull-retries", type=int, metavar="N",
                   help="tries after the first when a pull stalls (--pull-timeout) or fails for a reason that may "
                        "pass (default 1); a definitive registry answer (manifest unknown, not found, unauthorized, "
                        "denied) is not retried (pull_retries)")
    g.add_argument("--platform", choices=["linux/amd64", "linux/arm64"],
                   help="pull and run every instance image for this platform, e.g. linux/amd64 on an arm64 host "
                        "(emulated; default: the host's, and linux/amd64 for the instances swebench lists in "
                        "USE_X86 when the host is arm64) (platform)")
    g.add_argument("--prepare", action="store_true",
                   help="before any engine or episode starts, find every selected instance's image (pulling, a few "
                        "at a time; building only with --build-images), list each missing one with the reasons "
                        "and exit 2 if any is; with all present, go on and evaluate")
    g.add_argument("--prepare-only", action="store_true",
                   help="as --prepare, then stop: exit 0 with every image present, 2 with any missing "
                        "(the same as `sao-sandbox images`)")
    g.add_argument("--clean-images", action="store_true",
                   help="after grading, remove the instance images this run pulled or built (recorded in the "
                        "output folder's images.json, kept across --resume); never one named in --image-map nor "
                        "one that was present before the run")
    g.add_argument("--no-pull", dest="pull", action="store_const", const=False, default=None,
                   help="never pull an image: use the images this machine has, or builds with --build-images "
                        "(pull=false)")
    g.add_argument("--build-images", dest="build_images", action="store_const", const=True, default=None,
                   help="build an instance's image with swebench's own builders when no image is found; needs the "
                        "network and takes long (build=true; default: do not build)")
    g.add_argument("--no-hide-history", dest="hide_history", action="store_const", const=False, default=None,
                   help="WEAKENS THE BENCHMARK: keep the repository's commits after base_commit in the agent's and "
                        "the grader's containers, where the agent can read the fix (git log --all); scores are "
                        "then not comparable to SWE-bench's. For checking an image only (hide_history=false; "
                        "default: the later history is removed)")
    g.add_argument("--command-timeout", type=float, metavar="S",
                   help="seconds one command of the agent's bash tool may run (default 120; 60 for swe-local; "
                        "command_timeout_s)")
    g.add_argument("--eval-timeout", type=float, metavar="S",
                   help="seconds the test run of a grading may take; past it the grading is an infrastructure "
                        "error (default 1800; 300 for swe-local; eval_timeout_s)")
    g.add_argument("--max-format-errors", type=int, metavar="N",
                   help="consecutive replies without a usable tool call that end the episode (default 3; "
                        "max_format_errors)")
    g.add_argument("--cpus", type=float, metavar="N",
                   help="CPUs of each container, the agent's and the grader's (default 2; limits.cpus). swebench's "
                        "run_instance sets no limit")
    g.add_argument("--memory-mb", type=int, metavar="MB",
                   help="memory of each container, swap included, in MiB (default 4096; limits.memory_mb). "
                        "swebench's run_instance sets no limit")
    g.add_argument("--pids", type=int, metavar="N",
                   help="processes each container may hold (default 1024; limits.pids)")
    g.add_argument("--grading-network", dest="grading_network", action="store_const", const=True, default=None,
                   help="give the grading container network access, as swebench's run_instance does "
                        "(grading_limits.network). By default it has none: the agent's code runs there when the "
                        "tests import it, and could fetch the fix. For an eval script that must download "
                        "(a reinstall with build dependencies)")
    return p


SWE_FLAGS: dict[str, tuple[str, str]] = {
    # argparse dest: (the SWE environment's keyword argument, the flag); refused for other benchmarks
    "pull_timeout": ("pull_timeout_s", "--pull-timeout"),
    "pull_retries": ("pull_retries", "--pull-retries"),
    "platform": ("platform", "--platform"),
    "pull": ("pull", "--no-pull"),
    "build_images": ("build", "--build-images"),
    "hide_history": ("hide_history", "--no-hide-history"),
    "command_timeout": ("command_timeout_s", "--command-timeout"),
    "eval_timeout": ("eval_timeout_s", "--eval-timeout"),
    "max_format_errors": ("max_format_errors", "--max-format-errors"),
    "autosubmit": ("autosubmit", "--no-autosubmit"),
}
"""The SWE-bench group's environment flags (envs/swebench/env.py ``SWEBenchEnv``); each is also
``--env-arg KWARG=VALUE``, and giving both is refused."""

LIMIT_FLAGS: dict[str, tuple[str, str, str]] = {
    # argparse dest: (the environment's keyword argument, the SandboxLimits field it overrides, the flag)
    "cpus": ("limits", "cpus", "--cpus"),
    "memory_mb": ("limits", "memory_mb", "--memory-mb"),
    "pids": ("limits", "pids", "--pids"),
    "grading_network": ("grading_limits", "network", "--grading-network"),
}
"""The SWE-bench group's container limits: each kwarg (``limits``, ``grading_limits``) gets a mapping of
the fields its flags set (``SandboxLimits.overridden``); ``--env-arg limits={...}`` is the same kwarg."""


def _schedule(text: str) -> tuple[tuple[int, int, int], ...]:
    try:
        return parse_schedule(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


FLAG_OF = {"tools": "--tools", "sandbox": "--sandbox", "max_steps": "--max-steps", "images": "--image-map",
           **dict(SWE_FLAGS.values()),
           **{kwarg: "/".join(f for _, (k, _, f) in LIMIT_FLAGS.items() if k == kwarg)
              for kwarg, _, _ in LIMIT_FLAGS.values()}}
"""The environment keyword argument each flag sets, as the flag is named in messages."""


def _env_args(pairs: list[str], **flags: Any) -> dict[str, Any]:
    """The flags that are set, and the ``--env-arg`` pairs as sao-env reads them (sao.envs.cli.env_args);
    a keyword argument set by both is refused."""
    try:
        parsed = env_args(pairs)
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    given = {k: v for k, v in flags.items() if v is not None}
    if both := sorted(given.keys() & parsed.keys()):
        raise EvalError("; ".join(f"{FLAG_OF.get(k, k)} and --env-arg {k}={json.dumps(parsed[k])} both set {k}"
                                  for k in both) + ": give each once")
    return {**given, **parsed}


def _swe_env_args(args: argparse.Namespace) -> dict[str, Any]:
    """The SWE-bench group's environment keyword arguments that are set (:data:`SWE_FLAGS`, and the
    container limits of :data:`LIMIT_FLAGS`); refused for a benchmark that is not a SWE one."""
    given = {kwarg: getattr(args, dest) for dest, (kwarg, _) in SWE_FLAGS.items() if getattr(args, dest) is not None}
    for dest, (kwarg, field, _) in LIMIT_FLAGS.items():
        if getattr(args, dest) is not None:
            given.setdefault(kwarg, {})[field] = getattr(args, dest)
    if given and not patch_benchmark(args.benchmark):
        flags = ", ".join([flag for dest, (kwarg, flag) in SWE_FLAGS.items() if kwarg in given]
                          + [flag for dest, (_, _, flag) in LIMIT_FLAGS.items() if getattr(args, dest) is not None])
        swe = ", ".join(name for name in entries() if patch_benchmark(name))
        raise EvalError(f"{flags}: for the SWE benchmarks only ({swe}); {args.benchmark} is not one")
    return given


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.resume and args.output is None:
        print("error: --resume needs --output", file=sys.stderr)
        return 2
    output = args.output or Path("runs/eval") / f"{args.benchmark}-{datetime.now():%Y%m%d-%H%M%S}"
    with sigterm_as_interrupt():
        try:
            return _run(args, output)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated): episodes written so far are kept
            console.print(f"[yellow]{interrupt_name(exc)}[/]; finished episodes are in {output}; continue with "
                          f"--resume --output {output}", soft_wrap=True)  # one line: the path stays whole
            return interrupt_exit_code(exc)


def eval_config(args: argparse.Namespace, output: Path) -> EvalConfig:
    """The run's configuration from the parsed flags; a budget flag left out is the benchmark's
    (:meth:`EvalConfig._resolve_budgets`, from :mod:`sao.envs.budgets`)."""
    return EvalConfig(
        benchmark=args.benchmark, output=output, agent=args.agent, model=args.model, base_url=args.base_url, api_key=args.api_key,
        tokenizer=args.tokenizer, data=args.data, samples=args.samples, limit=args.limit,
        instance_ids=None if args.instance_ids is None else parse_instance_ids(args.instance_ids),
        filter=args.filter, shuffle=args.shuffle, slice=None if args.slice is None else parse_slice(args.slice),
        split=args.split,
        concurrency=args.concurrency if args.concurrency is not None else default_concurrency(args.benchmark),
        temperature=args.temperature, max_tokens=args.max_tokens,
        max_tokens_per_turn=args.max_tokens_per_turn, max_turns=args.max_turns,  # None: the benchmark's
        max_model_len=args.max_model_len, seed=args.seed, timeout_s=args.timeout,
        resume=args.resume, grade_only=None if args.grade_only is None else str(args.grade_only),
        endpoint_mode=args.endpoint_mode,
        speculative=SpeculativeConfig(method=args.speculative, num_tokens=args.spec_tokens, schedule=args.spec_schedule),
        max_restarts=args.max_restarts, replicas=args.replicas, router=args.router,
        prepare=args.prepare or args.prepare_only, clean_images=args.clean_images,
        agent_timeout_s=args.agent_timeout, agent_steps=args.agent_steps,
        env_args=_env_args(args.env_arg, tools=args.tools, sandbox=args.sandbox, max_steps=args.max_steps,
                           images=None if args.image_map is None else str(args.image_map),
                           **_swe_env_args(args)),
    )


def _run(args: argparse.Namespace, output: Path) -> int:
    try:
        cfg = eval_config(args, output)
        if args.prepare_only:
            return _prepare_only(cfg)
        board = Board()  # the episodes in flight: a status line each under the bar (instance, step, elapsed)
        bar = BoardProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("acc {task.fields[acc]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                            board=board, samples=cfg.samples > 1, console=console, transient=False)
        with contextlib.ExitStack() as shown:  # the bar appears when episodes start: an early error stays one line
            state = {"n": 0, "c": 0}

            def start(total: int, already: int):
                shown.enter_context(bar)
                task = bar.add_task(cfg.benchmark, total=total, completed=already, acc="-")

                def done(t: Trajectory) -> None:
                    state["n"] += 1
                    state["c"] += t.correct
                    bar.update(task, advance=1, acc=f"{state['c'] / state['n']:.3f}")

                return done

            summary = evaluate(cfg, progress=start, board=board)
    except EngineRestartsExhausted as exc:
        console.print(f"[red]{exc}[/]; finished episodes are in {output}; continue with --resume --output {output}")
        return 1
    except (EvalError, EnvError, AgentError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _print_summary(summary, output)
    return _report_problems(summary)


def _prepare_only(cfg: EvalConfig) -> int:
    """``--prepare-only``: every selected instance's image, listed; 0 when all are present (else
    :class:`~.swe_images.ImagesMissing`, exit 2)."""
    prep = prepare_images(cfg)
    print(prep.describe())
    console.print(f"all {len(prep.ready)} instance images are present; run without --prepare-only to evaluate")
    return 0


def _report_problems(summary: dict[str, Any]) -> int:
    """Print what the summary says went wrong; the exit code (1 when an episode could not be judged)."""
    if (warning := cut_warning(summary)) is not None:
        console.print(f"[bold red]WARNING: {warning}[/]")
    if summary["eval_errors"]:
        console.print(f"[yellow]{summary['eval_errors']} episode(s) could not be judged: the tests ran but produced "
                      "too few of the instance's results, with and without the patch (see 'eval_error' and "
                      "'grading_log' in trajectories.jsonl): the image cannot run its tests. They count as "
                      "neither solved nor unresolved, and --resume will not change them.[/]")
    if summary["infra_errors"]:
        console.print(f"[yellow]{summary['infra_errors']} episode(s) hit an infrastructure error (engine, container, "
                      "image; see 'error' in trajectories.jsonl); they are not counted as solved. "
                      "Failed episodes are retried by --resume.[/]")
    if summary["env_errors"]:
        console.print(f"[yellow]{summary['env_errors']} episode(s) failed in the environment's own code (it raised, "
                      "or its reset/step returned what Gymnasium's contract does not allow; see 'error' in "
                      "trajectories.jsonl): a bug of the environment, not of the model or the machine. They are "
                      "not counted as solved, and --resume will not retry them (they would fail the same way): "
                      "fix the environment (sao.envs.check_env) and evaluate into a new --output.[/]")
    if summary.get("agent_errors"):
        console.print(f"[yellow]{summary['agent_errors']} episode(s) failed in the agent plug-in: it raised, or ran "
                      "past --agent-timeout (exit_status agent_error or agent_timeout; see 'error' and "
                      "info.agent.log_tail in trajectories.jsonl, and agents/EPISODE_ID/agent.log). They are not "
                      "counted as solved, and --resume keeps them.[/]")
    return 1 if summary["infra_errors"] or summary["eval_errors"] or summary["env_errors"] else 0


def default_concurrency(benchmark: str) -> int:
    """32 episodes, or for a coding benchmark (each episode holds a container) what the machine holds."""
    from sao.sandboxes import container_slots

    if not patch_benchmark(benchmark):
        return 32
    slots = container_slots()
    console.print(f"concurrency {slots}: the containers this machine holds (--concurrency to change)")
    return slots


def _print_summary(summary: dict[str, Any], output: Path) -> None:
    table = Table(title=f"{summary['benchmark']} - {summary['model'] or summary['agent']}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("tasks x samples", f"{summary['n_tasks']} x {summary['samples_per_task']}")
    for k, v in summary["pass@k"].items():
        table.add_row(f"pass@{k}", f"{v:.4f}")
    for key in ("resolved", "graded_by_fallback", "infra_errors", "env_errors", "eval_errors", "n_failed",
                "n_truncated", "tokens_generated", "mode", "wall_s"):
        table.add_row(key, str(summary[key]))
    if "agent_errors" in summary:  # a summary written before agent plug-ins has none
        table.add_row("agent_errors", str(summary["agent_errors"]))
    for key, value in capture_rows(summary):  # an agent plug-in's calls through the capture proxy
        table.add_row(key, value)
    if "exit_status" in summary:
        table.add_row("exit_status", ", ".join(f"{k} {v}" for k, v in summary["exit_status"].items()) or "-")
        table.add_row("autosubmit", str(summary["autosubmit"]).lower())
    if "replicas" in summary:
        table.add_row("replicas", f"{summary['replicas']} ({summary['router']})")
    if "images_disk_start_bytes" in summary:  # SWE: docker system df's LayersSize
        table.add_row("images disk start -> end", f"{_gb(summary['images_disk_start_bytes'])} -> "
                                                  f"{_gb(summary['images_disk_end_bytes'])} GB")
    if "images_cleaned" in summary:
        cleaned = summary["images_cleaned"]
        table.add_row("images removed", f"{len(cleaned['removed'])} (failed {len(cleaned['failed'])})")
    for key in ("spec_acceptance", "spec_accepted_per_draft", "prefix_cache_hit_rate"):
        if key in summary:
            value = summary[key]
            table.add_row(key, "-" if value is None else f"{value:.3f}")
    Console().print(table)
    if summary["mode"] in ("text", "mixed"):
        console.print("text mode: the trajectories hold text turns and the API's usage counts, not tokens; "
                      "they cannot be trained on")
    console.print(f"outputs in {output}")


def _gb(size: int | None) -> str:
    return "?" if size is None else f"{size / 1e9:.2f}"


if __name__ == "__main__":
    sys.exit(main())
