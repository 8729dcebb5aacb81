"""Launch a script as a job of several processes on loopback (``jax.distributed``), for tests.

Each process runs ``python SCRIPT *args PROCESS_ID NUM_PROCESSES PORT`` with its own host devices
(``XLA_FLAGS``); all of them share one process group, so a test (or the script itself) can kill
the whole job at once, and the launcher kills whatever is left when it returns, on time out or on
error. Output goes to files (no pipe can fill and stall a process).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from helpers import ROOT, TEST_XLA_FLAGS


@dataclasses.dataclass
class Result:
    """One process of a job: its exit status (negative: killed by that signal), output, and when
    it ended (``time.time()``, seen by polling every 20 ms)."""

    returncode: int | None
    stdout: str
    stderr: str
    ended: float | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    script: Path,
    *args,
    folder: Path,
    processes: int = 2,
    devices: int = 2,
    timeout: float = 120,
    end_with: int | None = None,
) -> list[Result]:
    """Run the job and return each process's result (in process order).

    ``end_with``: when that process has ended, the others still running are killed (a job
    whose other processes hang).

    Raises:
      TimeoutError: the job ran past ``timeout`` seconds (it is killed first).
    """
    port = str(free_port())
    env = dict(os.environ)
    env.pop("JAX_ENABLE_X64", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {TEST_XLA_FLAGS}"
    env["JAX_PLATFORMS"] = "cpu"
    env["MPLBACKEND"] = "Agg"
    folder.mkdir(parents=True, exist_ok=True)
    started: list[subprocess.Popen] = []
    logs = []
    ended: list[float | None] = [None] * processes
    group = None
    try:
        for i in range(processes):
            out = open(folder / f"stdout_{i}.txt", "w")
            err = open(folder / f"stderr_{i}.txt", "w")
            logs.append((out, err))
            started.append(
                subprocess.Popen(
                    [sys.executable, str(script), *map(str, args), str(i), str(processes), port],
                    stdout=out,
                    stderr=err,
                    env=env,
                    cwd=ROOT,
                    process_group=0 if group is None else group,
                )
            )
            group = started[0].pid if group is None else group
        deadline = time.monotonic() + timeout
        while any(ended[i] is None for i in range(processes)):
            for i, p in enumerate(started):
                if ended[i] is None and p.poll() is not None:
                    ended[i] = time.time()
            if end_with is not None and ended[end_with] is not None:
                for i, p in enumerate(started):
                    if ended[i] is None:
                        p.kill()
                        p.wait(timeout=30)
                        ended[i] = time.time()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{script.name} {args}: the {processes}-process job ran past {timeout} s"
                )
            time.sleep(0.02)
    finally:
        if group is not None and any(p.poll() is None for p in started):
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in started:
            p.wait(timeout=30)
        for out, err in logs:
            out.close()
            err.close()
    return [
        Result(
            p.returncode,
            (folder / f"stdout_{i}.txt").read_text(),
            (folder / f"stderr_{i}.txt").read_text(),
            ended[i],
        )
        for i, p in enumerate(started)
    ]
