"""Named points a fault test can make a run stop at, so that the fault lands where the test says.

``TBA_EXT_HOLD_AT="checkpoint_saved@2,generate_begin@5"`` and ``TBA_EXT_HOLD_DIR=<folder>`` (both reach Ray's
workers with the rest of the launcher's environment): the first process to pass ``hold_point(point, step)``
with ``step >= N`` for a listed ``point@N`` writes ``<folder>/point@N.reached`` (JSON: pid, step) and waits
until ``<folder>/point@N.release`` exists; every later pass of that point goes on. The test reads the marker,
injects its fault into a program that is known to be at that point (a kill -9, a stopped worker), and releases
it or not. Unset, a hold point is one dictionary lookup. Points: ``step_begin`` and ``checkpoint_saved`` in the
trainer (verl's global step), ``trajectories_journaled`` in the replay buffer (a read just made durable, at the
step it is sampled for), ``generate_begin`` in the hfcpu rollout (the weight version it serves).
"""

from __future__ import annotations

import json
import os
import time

HOLD_AT_ENV = "TBA_EXT_HOLD_AT"
HOLD_DIR_ENV = "TBA_EXT_HOLD_DIR"
# A held program whose test died goes on after this long instead of hanging forever
HOLD_TIMEOUT_S = 900.0


def held_points(spec: str) -> list[tuple[str, int]]:
    """``"a@2,b@5"`` -> ``[("a", 2), ("b", 5)]``; anything else is refused naming the variable."""
    points = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, step = item.partition("@")
        if not sep or not name or not step.strip().isdigit():
            raise ValueError(f"{HOLD_AT_ENV}: {item!r} is not point@step (e.g. checkpoint_saved@2)")
        points.append((name, int(step)))
    return points


def marker(folder: str, point: str, at: int, kind: str) -> str:
    """The file a hold writes (``reached``) or waits for (``release``)."""
    return os.path.join(folder, f"{point}@{at}.{kind}")


def armed() -> bool:
    """Whether this process has hold points (a caller on a hot path asks before paying for a call)."""
    return bool(os.environ.get(HOLD_AT_ENV))


def reached(folder: str, point: str, at: int) -> bool:
    """Whether a process is held at ``point@at`` (its marker is written whole)."""
    return os.path.exists(marker(folder, point, at, "reached"))


def release(folder: str, point: str, at: int) -> None:
    """Let the process held at ``point@at`` go on."""
    open(marker(folder, point, at, "release"), "w").close()


def hold_point(point: str, step: int) -> None:
    spec = os.environ.get(HOLD_AT_ENV)
    if not spec:
        return
    folder = os.environ.get(HOLD_DIR_ENV)
    if not folder:
        raise ValueError(f"{HOLD_AT_ENV} is set without {HOLD_DIR_ENV}, the folder its markers go to")
    for name, at in held_points(spec):
        if name == point and step >= at:
            _hold(folder, point, at, step)


def _hold(folder: str, point: str, at: int, step: int) -> None:
    try:  # one process holds each point, once: a restarted worker or a second searcher passing it goes on
        os.close(os.open(marker(folder, point, at, "claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    reached = marker(folder, point, at, "reached")
    with open(reached + ".tmp", "w") as f:
        json.dump({"point": point, "at": at, "step": step, "pid": os.getpid()}, f)
    os.replace(reached + ".tmp", reached)  # whole when the test sees it
    print(f"tba-ext: held at {point}@{at} (step {step}, pid {os.getpid()})", flush=True)
    deadline = time.monotonic() + HOLD_TIMEOUT_S
    while not os.path.exists(marker(folder, point, at, "release")) and time.monotonic() < deadline:
        time.sleep(0.05)
