"""``metric_file_followed`` names a few files and counts the rest (issue 34 risk): 20,000 ``*.log``
files in a job's tree, 1,000 of them followed (the cap), made 3,686 journal lines in 25 s. Now a
pass names at most ``NAMED`` new files one line each per window and says the rest as one count;
files found later in the same window are counted and said with the next window's first pass."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from supervisor.watch.quiet import NAMED, REPEAT_AFTER_S, FirstFew
from tests.watch.test_metricfiles import Watch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lines:
    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append({"event": event, **fields})


def items(prefix: str, n: int) -> list[tuple[str, dict[str, Any]]]:
    return [(f"/w/{prefix}-{i}.log", {"kind": "log"}) for i in range(n)]


def test_a_burst_is_a_few_names_and_one_count_per_window() -> None:
    out, clock = Lines(), Clock()
    say = FirstFew("metric_file_followed", out, "read as the job writes it", clock=clock)
    say.say(items("a", 1000))
    assert [line["path"] for line in out.lines[:NAMED]] == [f"/w/a-{i}.log" for i in range(NAMED)]
    assert all("more" not in line and line["next"] == "read as the job writes it" for line in out.lines[:NAMED])
    [count] = out.lines[NAMED:]
    assert count["path"] == f"/w/a-{NAMED}.log" and count["more"] == 1000 - NAMED and count["kind"] == "log"
    assert count["next"].startswith(f"{1000 - NAMED} like it not named one by one")
    # The same window: a churning tree finds more on every pass; counted, not said.
    for _ in range(25):
        clock.now += 1.0
        say.say(items("b", 100))
    assert len(out.lines) == NAMED + 1
    # The next window: new ones are named again, then the count held (2,500) and theirs goes out.
    clock.now += REPEAT_AFTER_S
    say.say(items("c", NAMED + 2))
    assert [line["path"] for line in out.lines[NAMED + 1:]] == [f"/w/c-{i}.log" for i in range(NAMED)] + ["/w/b-0.log"]
    assert out.lines[-1]["more"] == 2500 + 2
    clock.now += REPEAT_AFTER_S
    say.say([])  # nothing new, nothing held: silent
    assert len(out.lines) == 2 * NAMED + 2


def test_a_quiet_tree_still_names_each_new_file() -> None:
    out, clock = Lines(), Clock()
    say = FirstFew("metric_file_followed", out, "n", clock=clock)
    for i in range(NAMED):
        say.say(items(f"x{i}", 1))
        say.say([])
    assert [line["path"] for line in out.lines] == [f"/w/x{i}-0.log" for i in range(NAMED)]
    assert not any("more" in line for line in out.lines)


def test_thousands_of_new_log_files_follow_all_and_say_a_few(tmp_path: Path) -> None:
    w = Watch([tmp_path], use_inotify=False)
    w.mf.baseline()
    for i in range(600):
        (tmp_path / f"worker-{i:04d}.log").write_text(f"step {i} loss 2.0\n")
    with capture_logs() as logs:
        for _ in range(3):
            w.mf.scan_now()
            for i in range(600, 650):  # more appear between passes
                (tmp_path / f"late-{i}-{_}.log").write_text("step 1 loss 2.0\n")
    followed = [e for e in logs if e["event"] == "metric_file_followed"]
    assert len(w.mf._files) == 700  # every file followed (600 + the 50 of each of the first two passes)
    assert len(followed) == NAMED + 1, followed
    assert followed[-1]["more"] == 600 - NAMED and all(e["path"].startswith(str(tmp_path)) for e in followed)
