"""Overlap generation with training: ``max_async_level`` (prime-rl's name; 0 = synchronous).

With ``max_async_level = k ≥ 1`` the generation of round ``j + k`` runs in a background thread
while the trainer trains on round ``j``. Round ``r`` is always generated from the weights after
round ``max(0, r − k)``, so its rows are exactly ``min(r, k)`` rounds stale — ``k`` from round
``k`` on; the rows' ``policy_version`` records that version and their behaviour log-probs are the
engine's own (``sampler_logp``, computed by the version that sampled them).

Per training round ``j`` (:meth:`RolloutPipeline.next`):

1. wait for the generation in flight (round ``j + k − 1``, started one round earlier);
2. first call only: generate rounds ``0 … k − 1`` from the initial weights, synchronously;
3. push the current weights (after round ``j − 1``) to the engine — no generation is in flight, so
   none straddles two versions;
4. start round ``j + k`` in the background from those weights;
5. return round ``j``.

At most one generation is in flight, overlapping exactly one training round; the ``k − 1`` other
rounds wait, already generated, in a queue. A checkpoint first waits for the generation in flight
(:meth:`RolloutPipeline.drain`) and then stores the queue, the loader and the round counter as they
are after it, so a resumed run trains on the same batches with the same weights (exact resume).

Only engines that do not share the trained module may overlap (``engine: vllm``): the colocated
``hf`` engine would sample from weights that change under it.

Source: prime-rl ``max_async_level`` (asynchronous off-policy RL with bounded staleness);
interpretation of issue 15 item 3 (staleness exactly the knob, behaviour log-probs from the
generating version, exact resume).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["RolloutPipeline"]


class RolloutPipeline:
    """The queue of pre-generated rounds and the one background generation.

    Args:
        trainer: the :class:`~rlvr.trainer.trainer.Trainer` (its ``generate_batch(policy_version=)``
            does the work; ``model``, ``engine``, ``global_step`` are read on the main thread only).
            The background thread advances ``trainer.rollout_round`` (seeds, group ids); this class
            advances ``trainer.generation_round`` (what schedules read) when it hands a round over,
            so a schedule plans round ``j`` the same way whatever the generation thread is doing.
        level: ``max_async_level`` (≥ 1).

    Attributes:
        ready: deque of ``(batch, metrics, source)`` already generated, oldest first; ``source`` = how
            many rounds the generating weights had been trained on.
        round_index: the training round the next :meth:`next` returns.
    """

    def __init__(self, trainer: Any, level: int) -> None:
        if level < 1:
            raise ValueError(f"RolloutPipeline needs max_async_level >= 1, got {level}")
        self.trainer = trainer
        self.level = int(level)
        self.ready: deque[tuple[Any, int]] = deque()  # (RoundResult, source round)
        self.round_index = 0
        self._inflight: Future | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlvr-rollout")
        self._started = False

    # ------------------------------------------------------------------------------------------
    def _generate(self, version: int, source_round: int) -> tuple[Any, int]:
        return self.trainer.prepare_round(policy_version=version), source_round

    def drain(self) -> float:
        """Wait for the generation in flight and queue its round; returns seconds waited."""
        if self._inflight is None:
            return 0.0
        t = time.perf_counter()
        fut, self._inflight = self._inflight, None
        self.ready.append(fut.result())  # re-raises a generation error here, on the main thread
        return time.perf_counter() - t

    def next(self) -> Any:
        """The next training round (see the module docstring for the order).

        Returns:
            Its :class:`rlvr.trainer.prepare.RoundResult` (batch, metrics, signal); metrics add ``async/wait_s`` (main thread blocked on generation),
            ``async/staleness_rounds`` (rounds between the generating weights and now) and
            ``async/queued_rounds``.
        """
        tr = self.trainer
        waited = self.drain()
        if not self._started and not self.ready:  # a fresh run: rounds 0 .. k-1 from the initial weights
            tr.sync_weights()
            for _ in range(self.level):
                self.ready.append(self._generate(tr.global_step, 0))  # all from the weights after 0 rounds
        self._started = True
        result, source = self.ready.popleft()
        j = self.round_index
        self.round_index += 1
        tr.generation_round += 1  # rounds handed to training: what schedules read (generation runs ahead)
        t = time.perf_counter()
        tr.sync_weights()  # weights after round j-1 (nothing is generating now)
        sync_s = time.perf_counter() - t
        if not self._last_round(tr):
            self._inflight = self._pool.submit(self._generate, tr.global_step, j)  # round j + k
        metrics = dict(result.metrics)
        metrics["async/wait_s"] = waited
        metrics["async/staleness_rounds"] = float(j - source)
        metrics["async/queued_rounds"] = float(len(self.ready))
        metrics["timing/weight_sync_s"] = sync_s
        return dataclasses.replace(result, metrics=metrics)

    @staticmethod
    def _last_round(tr: Any) -> bool:
        """True when the round being returned already takes the run to ``max_steps`` (nothing more to generate)."""
        return tr.global_step + tr.updates_per_generation >= tr.cfg.max_steps and not tr.cfg.dynamic_sampling.enable

    # ------------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """For checkpoints (call after :meth:`drain`): queued rounds and the round counter."""
        assert self._inflight is None, "drain() before saving"
        return {"ready": list(self.ready), "round_index": self.round_index, "started": self._started}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` returned."""
        self.ready = deque(state["ready"])
        self.round_index = int(state["round_index"])
        self._started = bool(state["started"])

    def close(self) -> None:
        """Wait for the generation in flight (its result is dropped) and stop the thread."""
        fut, self._inflight = self._inflight, None
        if fut is not None:
            try:
                fut.result()
            except Exception:
                pass
        self._pool.shutdown(wait=True)
