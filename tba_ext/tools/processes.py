"""The processes of one verl run, found and stopped by session (psutil): the launcher starts ``main_ppo`` in a
session of its own, and Ray's daemons and workers stay in it, so stopping that session stops exactly the run."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil


def session_pids(sid: int) -> list[int]:
    """Every live process in session ``sid``: verl's driver, Ray's daemons and Ray's workers (which run in
    process groups of their own, so killing the driver's group alone would leave them behind)."""
    pids = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                pids.append(proc.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return pids


def cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid``."""
    try:
        return [p.pid for p in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def terminate(proc: subprocess.Popen) -> None:
    """Stop the verl run we started and everything it started: SIGINT first so Ray shuts down cleanly,
    then SIGKILL whatever is left in its session. Only processes of that session are touched."""
    try:
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=20)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    deadline = time.time() + 10
    while time.time() < deadline:
        left = session_pids(proc.pid)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
