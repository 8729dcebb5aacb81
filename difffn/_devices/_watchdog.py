"""A lost process stops the others in bounded time, saying what happened and how to resume.

In a ``jax.distributed`` job, a process that dies (SIGKILL, a host failure) or stops answering
leaves the others waiting in the next collective of the step. JAX's coordination service
notices only after its heartbeat timeout (``jax.distributed.initialize(heartbeat_timeout_seconds=
100)``) and then aborts them with a C++ stack trace.

While a multi-host ``trainnet`` runs, `watching` keeps each process's heartbeat in the
coordination service's key-value store (``difffn/alive/<process>``: a counter a thread raises
every ``timeout / 5`` seconds) and reads the others'. A peer whose counter has not moved for
``timeout`` seconds (``TrainingOptions(process_timeout=...)``), or a coordination service that
does not answer for that long, is lost: this process writes on stderr which process was lost,
the last complete checkpoint and the ``resume_from`` to use, and exits at once with status
`EXIT_STATUS` (its main thread may be blocked in a collective that would never return;
exiting normally would also wait for ``jax.distributed``'s shutdown barrier, which a lost
process never reaches). A collective that fails instead of blocking (gloo reports the peer's
closed connection) waits for that verdict, up to the timeout, before its error is raised.
A peer not yet seen (it has not reached its first multi-host ``trainnet``) is not judged.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

import jax

EXIT_STATUS = 75  # sysexits.h EX_TEMPFAIL: a temporary failure; the job may be run again
_PREFIX = "difffn/alive/"
_heart: _Heartbeat | None = None


def _client():
    from jax._src import distributed  # the client of jax.distributed.initialize

    return distributed.global_state.client


class _Heartbeat(threading.Thread):
    """Raises this process's counter in the key-value store, for as long as the process lives."""

    def __init__(self, client, interval: float):
        super().__init__(name="difffn-heartbeat", daemon=True)
        self.client, self.interval = client, interval
        self.key = f"{_PREFIX}{jax.process_index()}"

    def run(self):
        beat = 0
        while True:
            beat += 1
            with contextlib.suppress(Exception):  # the service gone: the peers judge that
                self.client.key_value_set(self.key, str(beat), allow_overwrite=True)
            time.sleep(self.interval)


class _Watch:
    def __init__(self, client, timeout: float, describe: Callable[[], str]):
        self.client, self.timeout, self.describe = client, timeout, describe
        self.interval = max(0.05, timeout / 5)
        self.me, self.count = jax.process_index(), jax.process_count()
        self.stop = threading.Event()
        now = time.monotonic()
        self.answered = now  # the service's last answer
        self.seen: dict[int, tuple[str, float]] = {}  # peer: (its counter, when it changed)
        self.started = now

    def poll(self):
        while not self.stop.is_set():
            for peer in range(self.count):
                if peer == self.me:
                    continue
                try:
                    value = self.client.key_value_try_get(f"{_PREFIX}{peer}")
                except Exception as error:  # noqa: BLE001 - not there yet, or no service
                    if "NOT_FOUND" not in str(error) and "not found" not in str(error).lower():
                        continue  # the service did not answer: self.answered stays
                    value = None
                self.answered = time.monotonic()
                if value is not None and self.seen.get(peer, ("",))[0] != value:
                    self.seen[peer] = (value, self.answered)
            self.stop.wait(self.interval)

    def judge(self):
        while not self.stop.wait(self.interval):
            now = time.monotonic()
            if now - self.answered > self.timeout:
                self.lost(
                    0,
                    now - self.answered,
                    "the coordination service of jax.distributed "
                    "(process 0 hosts it) does not answer",
                )
            for peer, (_, changed) in list(self.seen.items()):
                if now - changed > self.timeout:
                    self.lost(peer, now - changed, "its heartbeat stopped")

    def lost(self, peer: int, silent: float, why: str):
        if self.stop.is_set():
            return
        message = (
            f"\ndifffn: process {peer} of {self.count} was lost: {why} {silent:.1f} s ago "
            f"(TrainingOptions process_timeout={self.timeout:g} s); it died, hangs, or its host "
            "or network failed. The other processes would wait for it in the next collective, "
            f"so process {self.me} stops now (exit status {EXIT_STATUS}).\n{self.describe()}\n"
        )
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.write(message)
            sys.stderr.flush()
        os._exit(EXIT_STATUS)


@contextlib.contextmanager
def watching(timeout: float, describe: Callable[[], str]) -> Iterator[None]:
    """Watch the other processes of the job while the body runs (see the module's docstring).

    ``describe()`` says what to do next (the last complete checkpoint, the ``resume_from``).
    One process: nothing is watched.
    """
    global _heart
    client = _client() if jax.process_count() > 1 else None
    if client is None:
        yield
        return
    if _heart is None:
        _heart = _Heartbeat(client, max(0.05, min(1.0, timeout / 5)))
        _heart.start()
    else:
        _heart.interval = min(_heart.interval, max(0.05, timeout / 5))
    watch = _Watch(client, timeout, describe)
    threads = [
        threading.Thread(target=watch.poll, name="difffn-watch-poll", daemon=True),
        threading.Thread(target=watch.judge, name="difffn-watch-judge", daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        yield
    except jax.errors.JaxRuntimeError:
        # a collective that failed (gloo: "Connection reset by peer") when a peer died: wait
        # for the watch to confirm that a process was lost (it then exits); else it is
        # another error, raised as it is
        watch.stop.wait(timeout + 3 * watch.interval)
        raise
    finally:
        watch.stop.set()
