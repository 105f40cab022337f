"""Worker processes that run a task's verifier where a hung call can be cut off (used by
:class:`rlvr.rewards.Scorer`). This module imports no torch: the fork server and every worker load only
it, :mod:`rlvr.tasks.base` and the task's own modules.

A reward function that *hangs* (issue 3) is cut off: with a timeout (or more than one worker) the
verifier runs in worker processes (:class:`VerifierPool`, ``forkserver`` start), which take the batch's
calls one at a time from one queue. **Each call has its own deadline**, ``timeout_s`` from when a
worker took it (issue 37, B20): a call past it is killed with its worker (its process group: what a
reward function forked goes too) and scored 0; the worker is replaced and the queue goes on, so the
calls behind a hung one are still scored. **A hung call costs only itself** (issue 25 item 3): when
calls are waiting and no worker is free, a spare worker is started for each worker that has been on
its call for :data:`STALL_FRACTION` of the timeout (up to ``max(MIN_SPARE_WORKERS, num_workers)``
spares per batch, ended after it). **The batch is bounded** at :data:`BATCH_DEADLINE_FACTOR` x
``timeout_s`` from the first worker being ready (issue 12: 32 hung calls one at a time with a 3 s
timeout took 97 s): calls still running or never started then score 0. Every such call is counted in ``ScoreStats.timeouts``. This follows verl's ``prime``
reward manager (all calls submitted at once to a process pool, one ``asyncio.wait_for`` timeout
each; code-precedent), with the deadline counted from when a worker takes the call. Without a timeout and with one worker, scoring stays in-process.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import pickle
import signal
import time
import weakref
from collections import deque
from multiprocessing.connection import wait as mp_wait
from typing import Any, Sequence

FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32 (``torch.finfo(torch.float32).max``; rewards are stored in float32)."""

STALL_FRACTION = 0.1
"""A worker on one call for this fraction of ``reward_timeout_s`` counts as stuck: when every worker
is, and calls are waiting, :class:`VerifierPool` starts a spare (interpretation: early enough that the
waiting calls still fit in the batch deadline; a legitimately slow verifier then gets extra workers,
bounded by the spare cap)."""

BATCH_DEADLINE_FACTOR = 2.0
"""A batch is cut off at this many ``reward_timeout_s`` after its first worker is ready (each call has its
own ``reward_timeout_s``; calls re-dispatched after a killed one get the rest of this bound). Interpretation:
twice the one-deadline-per-batch worst case it replaced (issue 37 item B20)."""

MIN_SPARE_WORKERS = 4
"""Spare workers a batch may start beyond ``reward_num_workers`` (at least; ``num_workers`` when larger)."""


def checked_score(raw: Any) -> float:
    """``float(raw)`` when it is finite and fits float32 (:data:`rlvr.rewards.REWARD_DTYPE`).

    Raises:
        ValueError: the score is NaN or infinite, or its magnitude exceeds float32's largest value
            (~3.4e38): stored in ``batch.rewards`` it would become ``inf`` and stop the run in the
            advantage computation with a traceback (a reward function returning ``1e300`` did).
    """
    score = float(raw)
    if not math.isfinite(score):
        raise ValueError(f"verifier returned a non-finite score {raw!r}")
    if abs(score) > FLOAT32_MAX:
        raise ValueError(f"verifier returned the score {raw!r}, outside the float32 range of rewards (|score| <= {FLOAT32_MAX:.3g})")
    return score


def _verify_item(task: Any, problem: Any, text: str) -> tuple[float, bool, str | None]:
    verdict = task.verify(problem, text)
    score = checked_score(verdict.score)
    return score, bool(verdict.correct), verdict.feedback


def _main_package() -> list[str]:
    """The package of a ``python -m pkg`` main module (``["pytest"]`` for ``pytest.__main__``), or
    ``["__main__"]`` for a script (multiprocessing then imports it once in the fork server): a
    forkserver child re-runs the main module, and its imports are then already done."""
    import sys

    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is None:
        return ["__main__"]
    pkg = spec.name.rpartition(".")[0]
    return [pkg] if pkg else []


def main_reimportable() -> bool:
    """Whether a ``spawn``/``forkserver`` child can rebuild ``__main__``: True for a module run with
    ``python -m`` (it has a ``__spec__``) or a script file that exists.

    False for a script read from stdin (``python - < train.py``: ``__file__`` is ``"<stdin>"``, which the
    child tries to open, so every worker exits while loading the task) and where ``__main__`` has no file
    (a notebook, the REPL, ``python -c``): a task class defined there does not exist in the child.
    """
    import sys

    main = sys.modules.get("__main__")
    if getattr(main, "__spec__", None) is not None:
        return True
    path = getattr(main, "__file__", None)
    if path is None:
        return False
    return os.path.isfile(path)


def _describe_exit(code: int | None) -> str:
    """``exit code 3`` / ``killed by SIGKILL`` for a worker's ``Process.exitcode`` (negative: a signal)."""
    if code is None:
        return "an unknown exit status"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _worker_main(conn: Any, payload: bytes) -> None:
    """Worker process loop: unpickle the task, then score lists of ``(idx, problem, text)`` items,
    answering ``(idx, score, correct, feedback, error)`` per item (``error`` = ``(kind, text)`` or None).

    The worker leads its own process group (what a reward function forks is ended with it, see
    :func:`_end_groups`) and ignores SIGINT: a Ctrl-C in the terminal is the trainer's to handle, once.
    Anything a reward function raises, ``KeyboardInterrupt`` and ``SystemExit`` included, is that
    call's error; the worker goes on.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        os.setpgid(0, 0)
    try:
        task = pickle.loads(payload)
    except BaseException as exc:  # noqa: BLE001
        conn.send(("init_error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        for idx, problem, text in msg:
            try:
                score, correct, feedback = _verify_item(task, problem, text)
                conn.send((idx, score, correct, feedback, None))
            except BaseException as exc:  # noqa: BLE001 - a user's reward function may raise anything
                conn.send((idx, 0.0, False, None, (type(exc).__name__, str(exc)[:500])))


def _end_groups(procs: Sequence[Any]) -> None:
    """SIGKILL each worker's process group (the worker and whatever its reward function forked), all
    first, then reap the workers. Interpretation: a verifier's children must not outlive the run
    (issue 25 item 4.11). A worker's pid names its group (:func:`_worker_main`); Linux does not reuse
    a pid while a process group of that id has members, so a group outliving its leader is still ours."""
    for proc in procs:
        if proc.pid is not None:
            with contextlib.suppress(OSError, AttributeError):
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError, ValueError, AttributeError):
            proc.kill()
    for proc in procs:
        proc.join(timeout=5.0)


def _stop_workers(workers: list) -> None:
    _end_groups([w["proc"] for w in workers if w is not None])
    for w in workers:
        if w is not None:
            w["conn"].close()
    workers[:] = [None] * len(workers)


class VerifierPool:
    """Worker processes running ``task.verify`` where a hung call can be stopped.

    Args:
        task: the task; must be picklable (it is sent to each worker once, at start).
        num_workers: worker processes (≥ 1) kept between batches; calls are handed out one at a time
            to whichever is free, so the batch is scored in parallel.
        timeout_s: seconds one call may run once a worker took it (0 = no limit); the batch is cut
            off at ``BATCH_DEADLINE_FACTOR x timeout_s`` from the first worker being ready (its start-up,
            importing the task's modules, is not counted); calls unanswered then are timeouts (see
            the module docstring).
        start_method: multiprocessing start method (``forkserver`` by default: workers do not
            inherit the trainer's threads or model memory). Where the default cannot rebuild
            ``__main__`` (:func:`main_reimportable` is False: a script read from stdin, a notebook or
            REPL) the pool uses ``fork`` instead, whose children inherit ``__main__`` as it is
            (interpretation: the verifier then runs beside an inherited copy of the trainer's memory,
            as a ``torch.utils.data.DataLoader`` worker does on Linux; without it every worker exited
            while loading the task).
        startup_timeout_s: seconds a worker may take to start and load the task.

    Raises:
        TypeError / pickle.PicklingError: the task cannot be pickled.

    Source: issue 3 ("a reward function that hangs is cut off after reward_timeout_s"); issue 25
    item 3 (a hung call costs only itself: spare workers, :data:`STALL_FRACTION`).
    """

    def __init__(self, task: Any, num_workers: int = 1, timeout_s: float = 30.0, *,
                 start_method: str = "forkserver", startup_timeout_s: float = 120.0) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self._payload = pickle.dumps(task)
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self.max_spares = max(MIN_SPARE_WORKERS, num_workers)
        methods = mp.get_all_start_methods()
        if start_method == "forkserver" and "fork" in methods and not main_reimportable():
            start_method = "fork"
        self._ctx = mp.get_context(start_method if start_method in methods else "spawn")
        if self._ctx.get_start_method() == "forkserver":
            # the fork server imports these once; each worker (and each replacement of a killed one)
            # is then forked with torch and rlvr already loaded: ~10 ms instead of seconds
            # (also the task's module and the main module's package, which each child would otherwise
            # import again: a spare started for a hung call is then ready in ~50 ms, not ~1 s)
            self._ctx.set_forkserver_preload(["rlvr.rewards.pool", "rlvr.tasks.base", type(task).__module__, *_main_package()])
        self._workers: list[dict[str, Any] | None] = [None] * num_workers
        self.restarts = 0
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers)

    def _start(self, k: int) -> dict[str, Any]:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_worker_main, args=(child, self._payload), daemon=True,
                                 name=f"rlvr-verifier-{k}")
        proc.start()
        child.close()
        w = {"proc": proc, "conn": parent, "ready": False, "item": None, "since": 0.0}
        self._workers[k] = w
        return w

    def _kill(self, *ks: int) -> None:
        """End workers ``ks`` together (see :func:`_end_groups`) and free their slots."""
        _stop_workers([self._workers[k] for k in ks])
        for k in ks:
            self._workers[k] = None
        self.restarts += len(ks)

    def close(self) -> None:
        """Stop every worker and what its reward function forked (idempotent)."""
        _stop_workers(self._workers)

    def start(self) -> None:
        """Launch any missing worker now without waiting for it: its start-up (fork, loading the task)
        then overlaps with whatever the caller does next (e.g. the first generation round)."""
        for j in range(self.num_workers):
            w = self._workers[j]
            if w is None or not w["proc"].is_alive():
                if w is not None:
                    self._kill(j)
                    self.restarts -= 1  # a dead idle worker being replaced is not a timeout restart
                self._start(j)

    def _replace(self, *js: int) -> None:
        """End workers ``js``; a kept slot (``j < num_workers``) gets a new worker, a spare's is freed."""
        self._kill(*js)
        for j in js:
            if j < self.num_workers:
                self._start(j)

    def _retire_spares(self) -> None:
        """End the spare workers started during a batch (idle now) and free their slots."""
        _stop_workers(self._workers[self.num_workers:])
        del self._workers[self.num_workers:]

    def run(self, items: Sequence[tuple[int, Any, str]]) -> dict[int, tuple[float, bool, str | None, tuple[str, str] | None]]:
        """Score ``items`` (``(idx, problem, text)``) in the workers.

        Returns:
            ``idx -> (score, correct, feedback, error)`` for every item; ``error`` is ``(kind, text)``
            for a verifier that raised, returned a non-number, was still running or not yet started
            when its own or the batch's deadline passed (kind ``"Timeout"``) or killed its worker (kind
            ``"WorkerDied"``, with the exit code or signal; a replacement takes the next calls), else None.

        Raises:
            RuntimeError: a worker cannot load the task (the message gives the worker's error), or
                none is ready within ``startup_timeout_s``.
        """
        results: dict[int, tuple[float, bool, str | None, tuple[str, str] | None]] = {}
        if not items:
            return results
        self.start()
        queue = deque(items)
        t0 = time.monotonic()
        deadline = math.inf  # the batch's hard bound: BATCH_DEADLINE_FACTOR x timeout_s from the first ready worker
        per_call = self.timeout_s if self.timeout_s > 0 else math.inf
        stall_s = STALL_FRACTION * self.timeout_s if self.timeout_s > 0 else math.inf
        timeout_text = f"reward function did not return within reward_timeout_s={self.timeout_s:g} s"
        try:
            while queue or any(w is not None and w["item"] is not None for w in self._workers):
                now = time.monotonic()
                if deadline == math.inf and self.timeout_s > 0 and any(w and w["ready"] for w in self._workers):
                    deadline = now + BATCH_DEADLINE_FACTOR * self.timeout_s
                overdue = [j for j, w in enumerate(self._workers)
                           if w is not None and w["item"] is not None and now >= w["since"] + per_call]
                for j in overdue:  # a call past its own deadline: only it is lost, the queue goes on
                    results[self._workers[j]["item"][0]] = (0.0, False, None, ("Timeout", timeout_text))
                if overdue:
                    self._replace(*overdue)
                    # re-check the loop: when that was the last call, nothing else would wake the wait
                    # below before the batch deadline (a killed spare sends no "ready"), so a batch whose
                    # hung calls had all been cut off at their own deadlines still waited 2 x timeout_s
                    continue
                for w in self._workers:  # hand a call to every free worker
                    if queue and w is not None and w["ready"] and w["item"] is None:
                        w["item"], w["since"] = queue.popleft(), now
                        w["conn"].send([w["item"]])
                live = [w for w in self._workers if w is not None]
                if queue and all(w["item"] is not None or not w["ready"] for w in live):
                    # no worker free: one spare for each worker stuck on its call (less those starting)
                    stuck = sum(w["item"] is not None and now - w["since"] >= stall_s for w in live)
                    starting = sum(not w["ready"] for w in live)
                    room = self.num_workers + self.max_spares - len(self._workers)
                    free = [j for j in range(self.num_workers, len(self._workers)) if self._workers[j] is None]
                    for _ in range(max(0, min(len(queue), stuck - starting, room + len(free)))):
                        if free:  # a spare slot freed by a killed call is reused
                            self._start(free.pop(0))
                        else:
                            self._workers.append(None)
                            self._start(len(self._workers) - 1)
                if now >= deadline:
                    break
                if deadline == math.inf and now - t0 > self.startup_timeout_s:
                    raise RuntimeError(f"reward worker did not start within {self.startup_timeout_s:.0f} s")
                wake = [deadline, t0 + self.startup_timeout_s if deadline == math.inf else math.inf]
                wake += [w["since"] + per_call for w in live if w["item"] is not None]
                if queue:
                    wake += [w["since"] + stall_s for w in live if w["item"] is not None]
                soonest = min(wake)
                conns = {w["conn"]: j for j, w in enumerate(self._workers) if w is not None}
                for conn in mp_wait(list(conns), timeout=None if soonest == math.inf else max(0.0, soonest - now)):
                    self._receive(conns[conn], results)
            hung = [j for j, w in enumerate(self._workers) if w is not None and w["item"] is not None]
            for j in hung:  # the deadline: calls still running are cut off
                results[self._workers[j]["item"][0]] = (0.0, False, None, ("Timeout", timeout_text))
            self._replace(*hung)
            for item in queue:
                results[item[0]] = (0.0, False, None, (
                    "Timeout", f"not scored: the batch ran past {BATCH_DEADLINE_FACTOR:g} x "
                    f"reward_timeout_s={self.timeout_s:g} s with every worker stuck on a hung call"))
        except BaseException:
            self.close()
            raise
        finally:
            self._retire_spares()
        return results

    def _receive(self, j: int, results: dict) -> None:
        """Read one message of worker ``j``: ready, a load failure, an answer, or its death."""
        w = self._workers[j]
        try:
            msg = w["conn"].recv()
        except (EOFError, OSError):
            w["proc"].join(timeout=2.0)  # its exit status, not None
            how = _describe_exit(w["proc"].exitcode)
            if w["item"] is None:
                raise RuntimeError(f"reward worker exited ({how}) while loading the task") from None
            results[w["item"][0]] = (0.0, False, None, (
                "WorkerDied", f"verifier worker exited ({how}) while scoring this completion"))
            self._replace(j)
            return
        if msg[0] == "ready":
            w["ready"] = True
        elif msg[0] == "init_error":
            raise RuntimeError(f"reward worker could not load the task: {msg[1]}")
        else:
            idx, score, correct, feedback, error = msg
            assert w["item"] is not None and w["item"][0] == idx, (w["item"], idx)
            results[idx] = (score, correct, feedback, error)
            w["item"] = None


