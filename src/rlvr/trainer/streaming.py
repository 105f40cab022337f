"""Streaming rollouts (``streaming.enable``): a producer thread samples whole groups continuously into a
buffer; the trainer takes ``prompts_per_generation`` groups per generation batch when the buffer has them.

Per chunk (``streaming.chunk_prompts`` prompts × ``num_generations`` samples; 0 = a whole generation batch),
in the producer thread:

1. wait until the chunk may start: its groups would be trained at most ``max_staleness`` optimizer updates
   after the weights that sample them (the buffer is first in, first out, so the update that will train a
   group is known when it is sampled), and no checkpoint has paused the producer;
2. hold the :class:`WeightGate` (the weights cannot change while it is held) and read its version ``v``;
   push the weights to an engine that keeps its own copy (vLLM server: ``generation_sync``), or re-cast an
   hf engine's bf16 copy;
3. sample the chunk, stamping every row with ``policy_version = v``; the behaviour log-probs are the
   engine's (``sampler_logp``). With an engine that decodes in this process (``engine: hf``: the trained
   module itself or a copy of it) the gate is held until the chunk's rows are finished: **every row is
   sampled under one version** — an update waits for the chunk in flight (``streaming/update_wait_s``).
   With ``streaming.partial_rollouts`` the engine instead asks a decode gate (:class:`_PartialGate`)
   before every decode step, which lets the updates waiting for the gate through and re-syncs the engine's
   copy: the rows in flight continue under the new weights (their KV cache recomputed,
   :mod:`rlvr.engines.partial`), each token records its version (``token_version``) and a row's
   ``policy_version`` is its oldest token's. A vLLM server decodes its own copy: the gate is released after
   the push, and the server is re-synced between chunks (between requests; no partial rollouts);
4. score and shape the rewards (the run's scorer; overlong penalty) and append the chunk's groups to the
   buffer, each whole (a group enters the buffer only complete).

In the trainer thread (:meth:`StreamingPipeline.next`, in place of one synchronous generation round): drop
groups older than ``max_staleness`` updates (by their oldest token; a safety net: step 1 keeps them from
being sampled), take the
``P`` oldest groups and run the synchronous path's own second half on them (behaviour / reference
log-probs, KL in the reward, advantages, batch filters, the round's metrics): advantages are taken per group
as always. The old log-probs the loss uses are the engine's behaviour log-probs (``old_logp =
sampler_logp``: the PPO ratio is taken against the policy that sampled each row, so clipping, the μ-GRPO
veto and the ``staleness/*`` metrics see each row's real version); with
``vllm_importance_sampling_correction`` they are the trainer's forward at the start of the batch instead
(the proximal policy) and the truncated importance weight ``min(π_prox / π_behaviour, C)`` corrects each
token towards it (decoupled PPO, :mod:`rlvr.core.rollout_is`).

The optimizer step is the only writer of the weights: :func:`rlvr.trainer.update.policy_update` enters
:meth:`StreamingPipeline.step_guard` around it, which waits for the producer to release the gate and sets
the gate's version to the step count after the update.

Checkpoints (:meth:`drain`) pause the producer after its chunk in flight, then store the buffer (scored
groups with their versions and behaviour log-probs), the loader and the round counter; a resumed run trains
on those groups first. Which version samples each later chunk depends on thread timing, so a streaming run
is not bitwise reproducible, resumed or not (``docs/streaming.md``).

Source: interpretation of asynchronous RL with bounded staleness and a rollout buffer — AReaL (Fu et al.
2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning", §4–5:
``max_head_offpolicyness``, decoupled PPO; §4.1 interruptible generation for partial rollouts) and
prime-rl's asynchronous trainer; issue 39 item 2.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from typing import Any, Iterator

from rlvr.rewards import ScoreStats
from rlvr.trainer.idle import RoundSignal
from rlvr.trainer.rollout import CollectStats, shape_rewards
from rlvr.types import RolloutBatch

__all__ = ["StreamingPipeline", "WeightGate", "token_staleness_metrics"]


class WeightGate:
    """Mutual exclusion between weight updates and sampling, with the version of the weights.

    The producer holds the gate (:meth:`hold`) while it reads or samples from the weights; the trainer's
    optimizer step runs inside :meth:`update`. An update waiting for the gate goes before the next chunk
    (a waiting update blocks new holds), so a fast producer cannot starve the trainer.

    Args:
        cond: the condition variable to share (the pipeline's, so buffer and gate changes wake each other).
        version: the weights' version now (optimizer updates done).

    Attributes:
        version: the version of the weights when nobody is updating them.
        update_wait_s: seconds updates have waited for the gate, in total.
    """

    def __init__(self, cond: threading.Condition, version: int = 0) -> None:
        self._cond = cond
        self.version = int(version)
        self._holding = False
        self._updating = False
        self._waiting = 0
        self.update_wait_s = 0.0

    @contextlib.contextmanager
    def hold(self) -> Iterator[int]:
        """Hold the weights fixed; yields their version."""
        with self._cond:
            while self._updating or self._waiting:
                self._cond.wait()
            self._holding = True
            v = self.version
        try:
            yield v
        finally:
            with self._cond:
                self._holding = False
                self._cond.notify_all()

    def yield_to_updates(self) -> int:
        """Inside :meth:`hold`: let the updates waiting for the gate run (partial rollouts, between two decode
        steps), then hold again; returns the version now (the one the hold started with when none waited)."""
        with self._cond:
            if self._waiting or self._updating:
                self._holding = False
                self._cond.notify_all()
                while self._updating or self._waiting:
                    self._cond.wait()
                self._holding = True
            return self.version

    @contextlib.contextmanager
    def update(self, next_version: int) -> Iterator[None]:
        """Change the weights inside; ``version`` becomes ``next_version`` at the exit (also on error)."""
        t = time.perf_counter()
        with self._cond:
            self._waiting += 1
            try:
                while self._holding:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._updating = True
        self.update_wait_s += time.perf_counter() - t
        try:
            yield
        finally:
            with self._cond:
                self.version = int(next_version)
                self._updating = False
                self._cond.notify_all()


class _PartialGate:
    """The :class:`rlvr.engines.partial.DecodeGate` of one chunk (``streaming.partial_rollouts``): between two
    decode steps the producer gives the :class:`WeightGate` to the updates waiting for it, and on a new version
    re-syncs the engine's own copy (``weight_sync``: a bf16 decode copy, a merged LoRA copy) before decoding on.

    Attributes:
        version: the version of the weights the chunk decodes with now.
        changes: weight changes met inside the chunk.
    """

    def __init__(self, pipeline: "StreamingPipeline", version: int) -> None:
        self._pipeline = pipeline
        self.version = int(version)
        self.changes = 0
        self._owner = threading.get_ident()  # the producer thread, which holds the WeightGate

    def between_steps(self) -> int:
        """Let waiting updates through; returns the version the next decode step uses. A ``generate`` call
        from another thread meanwhile (a user callback) holds no gate: it is answered without yielding."""
        if threading.get_ident() != self._owner:
            return self.version
        v = self._pipeline.gate.yield_to_updates()
        if v != self.version:
            sync = self._pipeline.trainer.weight_sync
            if sync is not None:
                sync(v)
            self.version = v
            self.changes += 1
        return v


class StreamingPipeline:
    """The producer thread, the buffer of whole groups and the trainer's side of it.

    Args:
        trainer: the :class:`~rlvr.trainer.trainer.Trainer`. The producer uses its ``_draw`` (loader, sampler,
            ``rollout_round``: seeds and group ids), ``scorer`` and engine sync points; the trainer thread
            uses the rest (``prepare`` helpers, counters).
        cfg: the run's ``streaming`` section (:class:`rlvr.config.sections.StreamingConfig`).

    Attributes:
        gate: the :class:`WeightGate`.
        round_index: generation batches taken so far.
        dropped_groups: groups dropped for staleness, in total.
    """

    def __init__(self, trainer: Any, cfg: Any) -> None:
        self.trainer = trainer
        self.max_staleness = int(cfg.max_staleness)
        self.P = int(trainer.cfg.prompts_per_generation)
        self.chunk = int(cfg.chunk_prompts) or self.P  # 0: a whole generation batch per generate call
        self.mu = int(trainer.updates_per_generation)
        self.partial = bool(getattr(cfg, "partial_rollouts", False))
        if self.partial and trainer.generation_sync is None and not hasattr(trainer.engine, "decode_gate"):
            from rlvr.errors import ConfigError

            raise ConfigError(f"streaming.partial_rollouts: the engine {type(trainer.engine).__name__} has no "
                             "decode_gate (partial rollouts need rlvr.engines.hf.HFEngine)")
        self.weight_changes = 0  # partial rollouts: weight changes met by chunks in flight, in total
        self._changes_at_take = 0
        self._cond = threading.Condition()
        self.gate = WeightGate(self._cond)
        self._buf: deque[tuple[RolloutBatch, float]] = deque()  # (one whole group, time it entered)
        self._paused = True
        self._busy = False
        self._closed = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._next_take_step = 0
        self.round_index = 0
        self._started = False
        self.dropped_groups = 0
        # time accounting (perf-counter seconds)
        self._t_take: float | None = None  # the previous take (the producer's start before the first)
        self._gen_total_at_take = 0.0
        self._gen_s_total = 0.0  # producer inside a chunk (sampling + scoring)
        self._gen_s = 0.0  # since the last take
        self._reward_s = 0.0
        self._score = ScoreStats()
        self._counts_at_take: list[int] | None = None
        self._timeouts_at_take = 0
        self._update_wait_at_take = 0.0

    # ------------------------------------------------------------------------------------ trainer side
    def step_guard(self) -> contextlib.AbstractContextManager:
        """The context :func:`rlvr.trainer.update.policy_update` enters around the optimizer step: the
        producer holds no weights inside, and the version after it is ``global_step + 1``."""
        return self.gate.update(self.trainer.global_step + 1)

    def next(self) -> Any:
        """The next generation batch from the buffer (blocks until ``P`` groups are there).

        Returns:
            A :class:`rlvr.trainer.prepare.RoundResult` prepared by the synchronous path's helpers; its
            metrics add ``streaming/*`` (see ``docs/streaming.md``).

        Raises:
            Exception: what the producer thread raised (re-raised here, on the trainer's thread).
        """
        from rlvr.trainer.prepare import REWARD_COUNTERS, RoundResult

        tr = self.trainer
        self._start()
        t = time.perf_counter()
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                self._drop_stale(tr.global_step)
                if len(self._buf) >= self.P:
                    break
                self._cond.wait()
            items = [self._buf.popleft() for _ in range(self.P)]
            self._next_take_step = tr.global_step + self.mu
            gen_s, reward_s, score = self._gen_s, self._reward_s, self._score
            self._gen_s, self._reward_s, self._score = 0.0, 0.0, ScoreStats()
            left = len(self._buf)
            self._cond.notify_all()
        now = time.perf_counter()
        waited = now - t
        self.round_index += 1
        tr.generation_round += 1
        batch = RolloutBatch.concat(_with_token_versions([g for g, _ in items]), tr.pad_token_id)
        timings = {"timing/generate_s": gen_s, "timing/reward_s": reward_s}
        # default: old_logp = the engine's behaviour log-probs; TIS: the trainer's (proximal) ones, corrected
        tr._behaviour_logprobs(batch, timings, overlapped=not tr.cfg.vllm_importance_sampling_correction)
        tr._advantages(batch)
        sampled = batch
        for f in tr.batch_filters:
            batch = f(batch)
        cstats = CollectStats(rounds=1, groups_seen=self.P, groups_kept=self.P, score=score, raw_batches=[sampled])
        metrics = tr._round_metrics(batch, sampled, cstats, timings, self._timeouts_at_take)
        metrics.update(self._stream_metrics(sampled, items, now, waited, left))
        counts_now = [getattr(tr.scorer, k, 0) for k in REWARD_COUNTERS]
        before = self._counts_at_take or [0] * len(counts_now)
        reward_counts = tuple(a - b for a, b in zip(counts_now, before))
        self._counts_at_take = counts_now
        self._timeouts_at_take = getattr(tr.scorer, "timeouts_total", 0)
        return RoundResult(batch, metrics, RoundSignal.of([sampled]), reward_counts)

    def _stream_metrics(self, sampled: RolloutBatch, items: list, now: float, waited: float,
                        left: int) -> dict[str, float]:
        """The ``streaming/*`` scalars of one take (see ``docs/streaming.md``)."""
        step = self.trainer.global_step
        stale = (step - sampled.policy_version).tolist()
        m: dict[str, float] = {}
        for k in range(self.max_staleness + 1):
            m[f"streaming/staleness_frac/{k}"] = sum(1 for s in stale if s == k) / max(len(stale), 1)
        m["streaming/staleness_mean"] = sum(stale) / max(len(stale), 1)
        m["streaming/buffer_wait_s"] = sum(now - t_in for _, t_in in items) / max(len(items), 1)
        m["streaming/trainer_wait_s"] = waited
        m["streaming/update_wait_s"] = self.gate.update_wait_s - self._update_wait_at_take
        self._update_wait_at_take = self.gate.update_wait_s
        # fractions of the wall time since the previous take (the first window includes the first fill)
        wall = max(now - (self._t_take or now), 1e-9)
        gen_total = self._gen_s_total - self._gen_total_at_take
        self._t_take, self._gen_total_at_take = now, self._gen_s_total
        m["streaming/engine_idle_frac"] = min(1.0, max(0.0, 1.0 - gen_total / wall))
        m["streaming/trainer_idle_frac"] = min(1.0, (waited + m["streaming/update_wait_s"]) / wall)
        m["streaming/buffer_groups"] = float(left)
        m["streaming/dropped_groups"] = float(self.dropped_groups)
        if self.partial:
            m.update(token_staleness_metrics(sampled, step, self.max_staleness))
            m["streaming/partial/weight_changes"] = float(self.weight_changes - self._changes_at_take)
            self._changes_at_take = self.weight_changes
        return m

    def _drop_stale(self, step: int) -> None:
        """Drop buffered groups sampled more than ``max_staleness`` updates before ``step`` (lock held).

        A group is as old as its oldest row, a row as its oldest token (``policy_version``; with partial
        rollouts the minimum of its ``token_version``): interpretation, ``docs/streaming.md``."""
        while self._buf and step - int(self._buf[0][0].policy_version.min()) > self.max_staleness:
            self._buf.popleft()
            self.dropped_groups += 1

    def _start(self) -> None:
        """Start the producer on the first call, un-pause it on later ones."""
        with self._cond:
            if self._thread is None:
                self.gate.version = self.trainer.global_step
                self._next_take_step = self.trainer.global_step
                self._t_take = time.perf_counter()
                self._thread = threading.Thread(target=self._run, name="rlvr-streaming", daemon=True)
                self._started = True
                self._paused = False
                self._thread.start()
            self._paused = False
            self._cond.notify_all()

    def drain(self) -> float:
        """Pause the producer after its chunk in flight (checkpoints, the end of a run); returns seconds
        waited. :meth:`next` resumes it."""
        t = time.perf_counter()
        with self._cond:
            self._paused = True
            while self._busy:
                self._cond.wait()
        return time.perf_counter() - t

    def close(self) -> None:
        """Stop the producer thread (after its chunk in flight)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    # ------------------------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """For checkpoints (call after :meth:`drain`): the buffered groups as one queued round, the round
        counter; the format of :meth:`rlvr.trainer.overlap.RolloutPipeline.state`."""
        from rlvr.trainer.prepare import RoundResult

        assert not self._busy, "drain() before saving"
        ready = []
        if self._buf:
            groups = _with_token_versions([g for g, _ in self._buf])
            ready.append((RoundResult(RolloutBatch.concat(groups, self.trainer.pad_token_id)), 0))
        return {"ready": ready, "round_index": self.round_index, "started": self._started}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` returned: the buffered groups, oldest first."""
        now = time.perf_counter()
        self._buf = deque((g, now) for r, _ in state["ready"] for g in _groups(r.batch))
        self.round_index = int(state["round_index"])

    # ------------------------------------------------------------------------------------ producer side
    def _may_start(self) -> bool:
        """Whether a chunk sampled now would be trained within ``max_staleness`` updates (lock held). Its last
        group decides; while the next batch is short of groups its first one does (a buffer restored from a
        checkpoint or thinned by drops need not hold whole chunks, and the trainer must not starve: groups
        that then turn out too old are dropped at take)."""
        b = len(self._buf)
        rounds_ahead = (b if b < self.P else b + self.chunk - 1) // self.P
        train_step = self._next_take_step + rounds_ahead * self.mu
        return train_step - self.gate.version <= self.max_staleness

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._paused or not self._may_start()):
                    self._cond.wait()
                if self._closed:
                    return
                self._busy = True
            try:
                t = time.perf_counter()
                groups, reward_s, score = self._produce()
                dt = time.perf_counter() - t
            except BaseException as exc:  # re-raised by next() on the trainer's thread
                with self._cond:
                    self._error = exc
                    self._busy = False
                    self._cond.notify_all()
                return
            with self._cond:
                now = time.perf_counter()
                self._buf.extend((g, now) for g in groups)
                self._gen_s += dt - reward_s
                self._gen_s_total += dt
                self._reward_s += reward_s
                self._score.errors += score.errors
                self._score.calls += score.calls
                self._score.last_error = score.last_error or self._score.last_error
                self._busy = False
                self._cond.notify_all()

    def _produce(self) -> tuple[list[RolloutBatch], float, ScoreStats]:
        """Sample, score and split one chunk into its groups: ``(groups, reward seconds, score stats)``."""
        tr = self.trainer
        local = tr.generation_sync is None  # the engine decodes in this process: hold until the rows are done
        with self.gate.hold() as version:
            self._sync_engine(version)
            if local and self.partial:  # the weights may change between decode steps (rlvr.engines.partial)
                gate = self._partial_gate(version)
                tr.engine.decode_gate = gate
                try:
                    batch = self._sample(version)
                finally:
                    tr.engine.decode_gate = None
                    self.weight_changes += gate.changes
            elif local:
                batch = self._sample(version)
        if not local:
            batch = self._sample(version)
        t = time.perf_counter()
        score = tr.scorer.score(batch) if batch.rewards is None else ScoreStats()
        shape_rewards(batch, tr.cfg)
        return _groups(batch), time.perf_counter() - t, score

    def _partial_gate(self, version: int) -> _PartialGate:
        """The decode gate of a chunk that starts at ``version`` (a seam for tests that force an update)."""
        return _PartialGate(self, version)

    def _sync_engine(self, version: int) -> None:
        """Give the engine the weights of ``version`` (gate held): push to a server, re-cast a bf16 copy."""
        tr = self.trainer
        ws = tr.generation_sync
        if ws is not None and ws.version != version:
            from rlvr.distributed.weights import full_named_tensors

            ws.push(full_named_tensors(tr.model), version)
        if tr.weight_sync is not None:
            tr.weight_sync(version)

    def _sample(self, version: int) -> RolloutBatch:
        tr = self.trainer
        tr._gen_version = version
        tr._draw_count = 0
        batch = tr._draw(self.chunk)  # seeds and group ids from rollout_round: one round per chunk
        tr.rollout_round += 1
        return batch


def token_staleness_metrics(batch: RolloutBatch, step: int, max_staleness: int) -> dict[str, float]:
    """Per-token staleness of ``batch`` taken at ``step`` (partial rollouts; ``docs/streaming.md``).

    A token's staleness is ``step − token_version`` (its row's ``policy_version`` where the batch has no
    ``token_version``), counted over the tokens the policy sampled (``model_mask``).

    Returns:
        ``streaming/staleness/token_frac/{0..max_staleness}`` (the histogram: fractions of tokens),
        ``streaming/staleness/token_mean``, ``streaming/staleness/token_max`` (updates), and
        ``streaming/partial/spanned_frac``: the fraction of rows whose tokens were sampled under more than
        one version (the rows a weight change reached in flight).
    """
    mask = batch.model_mask > 0
    ver = batch.token_version if batch.token_version is not None else batch.policy_version[:, None].expand_as(mask)
    stale = (step - ver)[mask]
    n = max(int(stale.numel()), 1)
    m = {f"streaming/staleness/token_frac/{k}": float((stale == k).sum()) / n for k in range(max_staleness + 1)}
    m["streaming/staleness/token_mean"] = float(stale.float().sum()) / n
    m["streaming/staleness/token_max"] = float(stale.max()) if stale.numel() else 0.0
    big, small = ver.masked_fill(~mask, -(2**62)).amax(1), ver.masked_fill(~mask, 2**62).amin(1)
    m["streaming/partial/spanned_frac"] = float(((big > small) & mask.any(1)).float().mean()) if len(batch) else 0.0
    return m


def _with_token_versions(groups: list[RolloutBatch]) -> list[RolloutBatch]:
    """``groups``, each given a ``token_version`` (its rows' ``policy_version`` on every completion token)
    when another has one, so they concatenate: a buffer restored from a run with ``partial_rollouts`` the
    other way mixes the two kinds."""
    if all(g.token_version is None for g in groups) or all(g.token_version is not None for g in groups):
        return groups
    for g in groups:
        if g.token_version is None:
            g.token_version = g.policy_version[:, None] * (g.completion_mask > 0).long()
    return groups


def _groups(batch: RolloutBatch) -> list[RolloutBatch]:
    """``batch``'s groups, each a batch of its rows, in order of first appearance."""
    gids = list(dict.fromkeys(batch.group_id.tolist()))
    out = []
    for g in gids:
        rows = (batch.group_id == g).nonzero(as_tuple=True)[0]
        out.append(batch.select(rows))
    return out
