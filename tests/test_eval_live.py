"""sao-eval's live status lines (evals/live.py): one per episode in flight, with its instance, the
environment steps so far and the time since it started; the steps counted by a wrapper around the
episode's environment, whoever plays. The drawn lines on a real episode: tests/test_swe_real_episode.py."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
from rich.console import Console
from rich.progress import BarColumn, TextColumn

from sao.evals.live import ENV, MODEL, RESETTING, Board, BoardProgress, CountedSteps, elapsed, watched
from sao.evals.runner import EvalConfig, evaluate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Steps(gym.Env):
    """Ends at its third step; records where the board said it was during each call."""

    observation_space = action_space = gym.spaces.Discrete(2)

    def __init__(self, board: Board) -> None:
        self.board, self.seen = board, []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.seen.append(("reset", self.board.workers()[0].phase, self.board.workers()[0].steps))
        return 0, {}

    def step(self, action: Any):
        (w,) = self.board.workers()
        self.seen.append(("step", w.phase, w.steps))
        return 0, 0.0, w.steps == 2, False, {}


def test_the_lines_show_instance_step_elapsed_and_phase_longest_running_first():
    clock = Clock()
    board = Board(clock)
    with board.tracking("psf__requests-5414", 0) as a:
        clock.now += 30
        with board.tracking("pydata__xarray-6599", 1) as b:
            board.update(a, steps=12, phase=ENV)
            board.update(b, steps=3, phase=MODEL)
            clock.now += 103
            assert board.lines() == ["psf__requests-5414  step 12  2:13  (env)",
                                     "pydata__xarray-6599  step 3  1:43  (model)"]
            assert board.lines(samples=True)[1].startswith("pydata__xarray-6599#1  step 3")
            assert board.lines(most=1) == ["psf__requests-5414  step 12  2:13  (env)", "... and 1 more"]
        assert [w.task_id for w in board.workers()] == ["psf__requests-5414"]
    assert board.workers() == [] and board.lines() == []


def test_an_episode_that_raises_leaves_the_board():
    board = Board()
    try:
        with board.tracking("t", 0):
            raise RuntimeError("the container died")
    except RuntimeError:
        pass
    assert board.workers() == []
    board.update(("t", 0), steps=3)  # a late update of an episode that left is ignored
    assert board.workers() == []


def test_elapsed_is_minutes_or_hours():
    assert [elapsed(s) for s in (0, 59.9, 61, 3599, 3600, 3 * 3600 + 62)] == \
        ["0:00", "0:59", "1:01", "59:59", "1:00:00", "3:01:02"]


def test_the_wrapper_counts_steps_and_says_who_has_the_turn():
    board = Board()
    with board.tracking("t", 0) as key:
        inner = Steps(board)
        env = CountedSteps(inner, board, key)
        env.reset(seed=1)
        assert board.workers()[0].phase == MODEL
        ended = False
        while not ended:
            _, _, ended, _, _ = env.step(0)
        assert inner.seen == [("reset", RESETTING, 0), ("step", ENV, 0), ("step", ENV, 1), ("step", ENV, 2)]
        assert (board.workers()[0].steps, board.workers()[0].phase) == (3, MODEL)
        assert env.unwrapped is inner


def test_without_a_board_the_environment_is_left_as_it_is():
    env = Steps(Board())
    with watched(None, "t", 0) as wrap:
        assert wrap(env) is env


def test_an_evaluation_puts_each_episode_on_the_board_while_it_runs(tmp_path: Path):
    """The runner's part, on the scripted gold agent: every episode was on the board with its step
    counted while it ran, and none is left when the run ends."""

    class Spy(Board):
        def __init__(self) -> None:
            super().__init__()
            self.updates: list[tuple[tuple[str, int], dict[str, Any]]] = []

        def update(self, key: tuple[str, int], **changes: Any) -> None:
            self.updates.append((key, changes))
            super().update(key, **changes)

    board = Spy()
    cfg = EvalConfig(benchmark="arithmetic", output=tmp_path / "out", agent="gold", limit=3, samples=2)
    summary = evaluate(cfg, board=board)
    assert summary["pass@1"] == 1.0 and summary["n_episodes"] == 6
    stepped = {key for key, changes in board.updates if changes.get("steps") == 1}
    results = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert stepped == {(row["task_id"], s) for row in results for s in (0, 1)}  # every episode, each sample
    assert board.workers() == []


def test_the_progress_bar_draws_the_lines_under_it():
    clock = Clock()
    board = Board(clock)
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=False, color_system=None)
    bar = BoardProgress(TextColumn("{task.description}"), BarColumn(), board=board, console=console, auto_refresh=False)
    bar.add_task("swe-bench-verified", total=4)
    with board.tracking("psf__requests-5414", 0) as key:
        board.update(key, steps=7, phase=ENV)
        clock.now += 75
        console.print(bar.get_renderable())
    console.print(bar.get_renderable())  # nothing in flight: the bar alone
    first, _, rest = out.getvalue().partition("\n")
    assert first.startswith("swe-bench-verified")
    assert rest.splitlines()[0].strip() == "psf__requests-5414  step 7  1:15  (env)"
    assert rest.splitlines()[1].startswith("swe-bench-verified") and len(rest.splitlines()) == 2
