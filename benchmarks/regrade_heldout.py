"""Re-grade the held-out answers a run recorded (``RUN_DIR/eval.jsonl``) with today's grader.

    .venv/bin/python benchmarks/regrade_heldout.py RUN_DIR [RUN_DIR ...]

For runs made before a grading fix: the policies' answers are what they are; only the verdict is
recomputed (the arithmetic problem is rebuilt from its task id). Prints, per run and evaluation
step, the recorded accuracy beside the re-graded one, and the re-graded first -> last change with
its paired 95% interval. It cannot undo what a wrong training reward did to a run: a policy that
was rewarded for a hack is still the policy that learned it.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

from sao.envs.arithmetic import ArithmeticTasks
from sao.envs.grading import grade
from sao.rl.training.heldout import paired_difference


def regrade(run_dir: Path) -> None:
    tasks = ArithmeticTasks()
    by_step: dict[int, dict[str, tuple[bool, bool]]] = defaultdict(dict)
    for line in (run_dir / "eval.jsonl").read_text().splitlines():
        r = json.loads(line)
        gold = tasks.get(r["task_id"]).answer
        now = r["status"] == "ok" and grade(r["answer"], gold, integer=True).correct
        by_step[r["step"]][r["task_id"]] = (bool(r["correct"]), now)
    steps = sorted(by_step)
    line = " ".join(f"{s}: {sum(a for a, _ in by_step[s].values()) / len(by_step[s]):.3f}->"
                    f"{sum(b for _, b in by_step[s].values()) / len(by_step[s]):.3f}" for s in steps)
    first, last = by_step[steps[0]], by_step[steps[-1]]
    ids = sorted(set(first) & set(last))
    diff = paired_difference([first[i][1] for i in ids], [last[i][1] for i in ids])
    print(f"{run_dir.name}: recorded->regraded per step {line}; regraded change {diff.value:+.3f} "
          f"[{diff.low:+.3f}, {diff.high:+.3f}]")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        regrade(Path(arg))
