"""The multi-turn sampler: environment episodes, token-in/token-out, batched turn by turn.

Turn 1 asks the engine for ``G`` samples of each problem's opening prompt (one request with ``n = G``,
as the group sampler does); each later turn is **one** batched engine call over every live trajectory
(its context = prompt + everything so far, ``n = 1``). The tokens the engine sampled are appended as
they are; an observation's tokens are rendered once (:class:`rlvr.envs.template.ObservationRenderer`)
and appended with ``loss_mask = 0``. A row of the batch is the whole trajectory: ``context_ids`` = the
opening prompt, ``completion_ids`` = every token after it (model and environment), ``completion_mask``
= 1 over that span, ``loss_mask`` = 1 on model tokens only, ``sampler_logp`` = the engine's log-probs
(0 at environment tokens). The batch comes back scored (``rewards`` = the sum of the step rewards).

Limits (``env:``): ``max_turns``, ``max_tokens`` (model + environment tokens after the prompt; a model
turn is capped by what is left, an observation that does not fit ends the episode) and ``timeout_s``
(wall-clock seconds of the environment's own calls per episode: ``reset`` and every ``step`` together;
interpretation: waiting for the engine or for batch-mates' steps does not count, so one hung episode
times out alone). Finish reasons: ``env_done`` (the environment ended it), ``max_turns``,
``length`` (the last model turn was cut by a token cap, or the budget ran out), ``error`` / ``timeout``
(the environment failed: reward 0, see :mod:`rlvr.envs.runner`).

Source: issue 26 items 2, 8 and 9; interpretation of verl's agent loop (``response_mask``) and TRL's
``rollout_func``, with the batching of later turns into one engine call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from rlvr.envs import Step, env_factory, resolve_env_class
from rlvr.envs.runner import EnvFault, FaultLog, call_many, check_messages, check_step, timed_calls
from rlvr.envs.template import ObservationRenderer, check_append_only, render_opening
from rlvr.errors import ConfigError
from rlvr.samplers.group import generations_to_batch
from rlvr.types import Generation, GenerationRequest, RolloutBatch, SamplingParams

__all__ = ["EpisodeLimits", "MultiTurnSampler", "build_env_factory", "check_env_config", "episode_sampler_factory",
           "make_multiturn_sampler"]

EPISODE_FINISH = ("env_done", "max_turns", "length", "error", "timeout")
"""Episode finish reasons, logged as ``env/finish/<reason>`` (fractions of the round's episodes)."""
TURN_FINISH = ("eos", "length")
"""Why a model turn stopped (the engine's finish reason), logged as ``env/turn_finish/<reason>``."""


@dataclass(frozen=True)
class EpisodeLimits:
    """``max_turns`` (≥ 1 model turns), ``max_tokens`` (model + environment tokens after the prompt)
    and ``timeout_s`` (wall clock per episode, ``0`` = none)."""

    max_turns: int
    max_tokens: int
    timeout_s: float


@dataclass
class _Episode:
    env: Any
    problem_index: int
    group: int
    prompt: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turn_finish: list[str] = field(default_factory=list)
    reward: float = 0.0
    correct: bool | None = None
    feedback: str | None = None
    finish: str | None = None  # set when the episode is over
    tool_calls: int = 0
    tool_errors: int = 0
    env_tokens: int = 0
    env_time_left: float = math.inf  # seconds of environment time this episode has left (env.timeout_s)
    action: str = ""  # the last model turn, decoded

    def summary(self) -> dict[str, Any]:
        """Plain data of the finished episode (what :func:`episode_metrics` reads; ``rlvr eval`` keeps it
        per sample)."""
        return {"turns": len(self.turn_finish), "finish": self.finish, "turn_finish": list(self.turn_finish),
                "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
                "model_tokens": int(sum(self.loss)), "env_tokens": self.env_tokens,
                "turn_rewards": list(self.turn_rewards)}

    @property
    def live(self) -> bool:
        return self.finish is None

    def deadline(self) -> float:
        return time.monotonic() + self.env_time_left


class MultiTurnSampler:
    """Runs one environment episode per rollout (see the module docstring).

    Args:
        engine: an :class:`rlvr.engines.base.Engine` (HF or vLLM: both take per-row prompt token ids).
        tokenizer: the policy's tokenizer (chat template, decoding of actions).
        make_env: zero-argument factory, one environment per trajectory.
        limits: :class:`EpisodeLimits`.
        encoder: the run's :class:`rlvr.samplers.group.PromptEncoder` (its ``max_prompt_length`` and
            truncation counter are shared, so ``prompts/truncated_total`` counts episodes too).
        pad_token_id: right padding of ``completion_ids``.

    The first environment is made once here to read its ``tools``, ``observation_roles`` and
    ``reward_name`` and to check the chat template (:func:`rlvr.envs.template.check_append_only`) for
    those roles when episodes can have more than one turn.

    Raises:
        ConfigError: the chat template is not append-only for the environment's observations.
    """

    def __init__(self, engine: Any, tokenizer: Any, make_env: Callable[[], Any], limits: EpisodeLimits,
                 encoder: Any, pad_token_id: int) -> None:
        self.engine, self.tokenizer, self.make_env, self.limits = engine, tokenizer, make_env, limits
        self.encoder, self.pad_token_id = encoder, pad_token_id
        self.faults = FaultLog()
        self.last_episodes: list[dict[str, Any]] = []
        probe = make_env()
        self.tools = getattr(probe, "tools", None) or None
        self.reward_name = str(getattr(probe, "reward_name", "env"))
        roles = tuple(getattr(probe, "observation_roles", ("user",)))
        if callable(getattr(probe, "close", None)):
            call_many([(probe.close, (), math.inf)])
        eos = int(tokenizer.eos_token_id)
        self.renderer = ObservationRenderer(tokenizer, tokenizer.eos_token, self.tools)
        if limits.max_turns > 1 and roles:
            check_append_only(tokenizer, eos, roles, self.tools)
        self.eos_id = eos  # the template's end-of-turn text is left out after it (the model already wrote it)

    # ---------------------------------------------------------------------------------------------
    def _prompt_ids(self, messages: list[dict[str, Any]], uid: Any) -> list[int]:
        ids = list(self.tokenizer(render_opening(self.tokenizer, messages, self.tools),
                                  add_special_tokens=False)["input_ids"])
        cap = self.encoder.max_prompt_length
        if len(ids) > cap:  # left truncation, counted and warned once, as PromptEncoder does
            self.encoder.truncated += 1
            if self.encoder.truncated == 1:
                warnings.warn(f"prompt of problem {uid!r} has {len(ids)} tokens > max_prompt_length={cap}; "
                              f"keeping the last {cap}", stacklevel=3)
            ids = ids[-cap:]
        return ids

    def _fail(self, ep: _Episode, method: str, fault: EnvFault) -> None:
        self.faults.record(ep.env, method, fault)
        ep.finish, ep.reward = fault.kind, 0.0

    def _reset(self, problems: Sequence[Any], G: int, first_group_id: int) -> list[_Episode]:
        eps: list[_Episode] = []
        budget = self.limits.timeout_s if self.limits.timeout_s > 0 else math.inf
        for p in range(len(problems)):
            for _ in range(G):
                try:
                    env = self.make_env()
                except Exception as exc:  # noqa: BLE001 - user code
                    env = None
                    fault = EnvFault("error", f"raised {type(exc).__name__}: {exc}")
                ep = _Episode(env, p, first_group_id + p, env_time_left=budget)
                if env is None:
                    self._fail(ep, "__init__", fault)
                eps.append(ep)
        live = [e for e in eps if e.live]
        outs = self._calls(live, "reset", [(problems[e.problem_index],) for e in live])
        for ep, out in zip(live, outs):
            bad = out if isinstance(out, EnvFault) else check_messages(out)
            if bad is not None:
                self._fail(ep, "reset", bad if isinstance(bad, EnvFault) else EnvFault("error", f"returned the wrong type: {bad}"))
            else:
                ep.prompt = self._prompt_ids(out, getattr(problems[ep.problem_index], "uid", ep.problem_index))
        for ep in eps:  # a failed reset still needs a context for its (empty) row: the task's own prompt
            if not ep.prompt:
                ep.prompt = list(self.encoder(problems[ep.problem_index]))
        return eps

    def _calls(self, eps: list[_Episode], method: str, args: list[tuple]) -> list[Any]:
        """``ep.env.<method>(*args)`` for each episode, concurrently, each within its environment time left."""
        out = timed_calls([(getattr(e.env, method), a, e.deadline()) for e, a in zip(eps, args)])
        for e, (_, took) in zip(eps, out):
            e.env_time_left -= took
        return [r for r, _ in out]

    def _generate(self, live: list[_Episode], params: SamplingParams, turn: int) -> None:
        """One engine call over ``live``: turn 1 groups a problem's identical prompts into one request."""
        cap = params.max_new_tokens
        pieces: list[tuple[list[_Episode], list[int], int]] = []
        for ep in live:
            left = self.limits.max_tokens - len(ep.tokens)
            ctx = ep.prompt + ep.tokens
            last = pieces[-1] if pieces else None
            if turn == 1 and last and last[0][0].problem_index == ep.problem_index and last[1] == ctx:
                last[0].append(ep)
            else:
                pieces.append(([ep], ctx, left))
        requests = [GenerationRequest(context_ids=ctx, n=len(group), max_new_tokens=None if left >= cap else left)
                    for group, ctx, left in pieces]
        if turn > 1 and params.seed is not None:  # a fresh stream per turn; turn 1 = the group sampler's
            params = dataclasses.replace(params, seed=(params.seed + 7919 * turn) % 2**31)
        outputs = self.engine.generate(requests, params)
        for (group, _, _), gens in zip(pieces, outputs):
            if len(gens) != len(group):
                raise RuntimeError(f"engine returned {len(gens)} generations for a request of n={len(group)}")
            for ep, g in zip(group, gens):
                ep.tokens += list(g.token_ids)
                ep.loss += [1.0] * len(g.token_ids)
                ep.logps += [float(x) for x in g.logprobs]
                ep.turn_finish.append(g.finish_reason)

    def _after_step(self, ep: _Episode, out: Any, turn_tokens: list[int]) -> None:
        bad = out if isinstance(out, EnvFault) else check_step(out)
        if bad is not None:
            self._fail(ep, "step", bad if isinstance(bad, EnvFault) else EnvFault("error", f"returned the wrong type: {bad}"))
            return
        step: Step = out
        r = float(step.reward)
        ep.reward += r
        ep.turn_rewards.append(r)
        info = step.info or {}
        if "correct" in info:
            ep.correct = bool(info["correct"])
        ep.tool_calls += int(info.get("tool_calls", 0) or 0)
        ep.tool_errors += int(info.get("tool_errors", 0) or 0)
        ep.feedback = step.feedback if step.feedback is not None else ep.feedback
        cut = ep.turn_finish[-1] == "length"
        if step.done:
            ep.finish = "length" if cut else "env_done"
        elif len(ep.turn_finish) >= self.limits.max_turns:
            ep.finish = "length" if cut else "max_turns"
        else:
            obs = self.renderer.tokens(step.observation, after_eos=bool(turn_tokens) and turn_tokens[-1] == self.eos_id)
            if len(ep.tokens) + len(obs) + 1 > self.limits.max_tokens:
                ep.finish = "length"  # the observation (and one more model token) does not fit the budget
                return
            ep.tokens += obs
            ep.loss += [0.0] * len(obs)
            ep.logps += [0.0] * len(obs)
            ep.env_tokens += len(obs)

    def sample(self, problems: Sequence[Any], num_generations: int, params: SamplingParams, *,
               policy_version: int = 0, first_group_id: int = 0) -> RolloutBatch:
        """``len(problems) × num_generations`` episodes; group ``first_group_id + p`` is problem ``p``.

        Returns a scored batch (``rewards``, ``correct``, ``texts``, ``feedback``, ``loss_mask``) with the
        round's ``env/*`` metrics in ``batch.metrics``; ``self.last_episodes`` then holds one
        :meth:`_Episode.summary` per row (plus ``action``: its last model turn, decoded), in row order.
        """
        errors0, timeouts0 = self.faults.errors, self.faults.timeouts
        eps = self._reset(problems, num_generations, first_group_id)
        session = getattr(self.engine, "kv_session", None)  # HF engine: later turns prefill only what is new
        with session() if callable(session) and self.limits.max_turns > 1 else contextlib.nullcontext():
            self._turns(eps, params)
        closing = [e for e in eps if e.env is not None and callable(getattr(e.env, "close", None))]
        for ep, out in zip(closing, call_many([(e.env.close, (), time.monotonic() + max(e.env_time_left, 1.0))
                                               for e in closing])):
            if isinstance(out, EnvFault):
                self.faults.record(ep.env, "close", out)
        batch = self._to_batch(eps, problems, params, policy_version)
        self.last_episodes = [{**e.summary(), "action": e.action} for e in eps]
        batch.metrics = {**episode_metrics([e.summary() for e in eps]), "env/errors": float(self.faults.errors - errors0),
                                 "env/timeouts": float(self.faults.timeouts - timeouts0)}
        return batch

    def _turns(self, eps: list[_Episode], params: SamplingParams) -> None:
        """Take turns until no episode is live: one batched engine call over the live episodes, then their steps."""
        turn = 0
        while True:
            for ep in eps:
                if ep.live and len(ep.tokens) >= self.limits.max_tokens:
                    ep.finish = "length"
            live = [e for e in eps if e.live]
            if not live:
                return
            turn += 1
            starts = [len(e.tokens) for e in live]
            self._generate(live, params, turn)
            actions = [self.tokenizer.decode(e.tokens[s:], skip_special_tokens=True) for e, s in zip(live, starts)]
            outs = self._calls(live, "step", [(a,) for a in actions])
            for ep, a in zip(live, actions):
                ep.action = a
            for ep, s, out in zip(live, starts, outs):
                self._after_step(ep, out, ep.tokens[s:])

    def _to_batch(self, eps: list[_Episode], problems: Sequence[Any], params: SamplingParams,
                  policy_version: int) -> RolloutBatch:
        gens = [Generation(e.tokens, e.logps, "length" if e.turn_finish and e.turn_finish[-1] == "length" else "eos")
                for e in eps]
        batch = generations_to_batch([e.prompt for e in eps], gens, group_ids=[e.group for e in eps],
                                     prompt_index=[e.problem_index for e in eps], problems=list(problems),
                                     pad_token_id=self.pad_token_id, temperature=params.temperature,
                                     policy_version=policy_version)
        loss = torch.zeros_like(batch.completion_mask)
        for i, e in enumerate(eps):
            loss[i, : len(e.loss)] = torch.tensor(e.loss, dtype=loss.dtype)
        rewards = torch.tensor([e.reward for e in eps], dtype=torch.float32)
        batch.loss_mask = loss
        batch.rewards = rewards
        batch.correct = torch.tensor([e.correct if e.correct is not None and e.finish not in ("error", "timeout")
                                      else e.reward > 0 for e in eps], dtype=torch.bool)
        batch.texts = self.tokenizer.batch_decode([e.tokens for e in eps], skip_special_tokens=True)
        batch.feedback = [e.feedback for e in eps]
        batch.reward_components[self.reward_name] = rewards.clone()
        return batch


def episode_metrics(eps: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per-episode means (``env/turns_mean``, ``env/tool_calls``, ``env/tool_errors``, ``env/model_tokens``,
    ``env/env_tokens``), finish-reason fractions (``env/finish/<reason>``, ``env/turn_finish/<reason>``)
    and the mean reward of turn ``k`` over the episodes that reached it (``env/turn_reward/<k>``).

    Args:
        eps: episode summaries (:meth:`_Episode.summary`: ``turns``, ``finish``, ``turn_finish``,
            ``tool_calls``, ``tool_errors``, ``model_tokens``, ``env_tokens``, ``turn_rewards``).
    """
    n = max(len(eps), 1)
    out = {f"env/{key}": sum(e[key] for e in eps) / n
           for key in ("tool_calls", "tool_errors", "model_tokens", "env_tokens")}
    out = {"env/turns_mean": sum(e["turns"] for e in eps) / n, **out}
    for r in EPISODE_FINISH:
        out[f"env/finish/{r}"] = sum(e["finish"] == r for e in eps) / n
    turns = [f for e in eps for f in e["turn_finish"]]
    for r in TURN_FINISH:
        out[f"env/turn_finish/{r}"] = sum(f == r for f in turns) / max(len(turns), 1)
    for k in range(max([len(e["turn_rewards"]) for e in eps] + [0])):
        got = [e["turn_rewards"][k] for e in eps if len(e["turn_rewards"]) > k]
        out[f"env/turn_reward/{k + 1}"] = sum(got) / len(got)
    return out


# ---- wiring from the config (called by rlvr.parts)

REFUSED_SAMPLERS = {
    "tree": "IB-TPO's tree sampler forks single completions at token positions; an episode's later turns "
            "depend on environment answers to whole turns, so there is no tree to fork (not supported yet)",
    "feedback": "FBOS-RL's feedback sampler re-prompts with the verifier's feedback itself; with an environment "
                "use env.type=feedback for retries instead",
    "hard_prompt": "UEC-RL's hard-prompt sampler draws extra exploration groups under its own prompts; it does "
                   "not run environment episodes (not supported yet)",
}


def build_env_factory(cfg: Any, task: Any = None, system_prompt: str | None = None) -> Callable[[], Any]:
    """The per-trajectory factory of ``cfg.env`` (its extra keys are the class's keyword arguments).

    Raises:
        ConfigError: ``env.type`` cannot be imported or names no registered environment, or a keyword
            the class does not take.
    """
    spec = cfg.env.type
    cls = resolve_env_class(spec)
    return env_factory(cls, dict(cfg.env.model_extra or {}), task=task, system_prompt=system_prompt, spec=spec)


def check_env_config(cfg: Any) -> None:
    """Before any model loads: ``env.type`` imports and takes its keywords; the sampler can run episodes.

    Raises:
        ConfigError: (exit 2) the import error, a bad keyword, ``sampler: multiturn`` without
            ``env.type``, or a sampler that cannot run environments (saying why).
    """
    env = getattr(cfg, "env", None)
    if env is None or env.type is None:
        if cfg.sampler == "multiturn":
            raise ConfigError("sampler: multiturn needs an environment: set env.type (e.g. env.type=single, "
                              "or 'my_module:MyEnv')")
        return
    if cfg.sampler in REFUSED_SAMPLERS:
        raise ConfigError(f"env.type={env.type!r} cannot run with sampler: {cfg.sampler}: {REFUSED_SAMPLERS[cfg.sampler]}. "
                          "Use sampler: group (or multiturn)")
    if cfg.sampler not in ("group", "multiturn"):
        raise ConfigError(f"env.type={env.type!r} needs sampler: group or multiturn (the environment's episodes "
                          f"are the sampling), got sampler: {cfg.sampler}")
    build_env_factory(cfg)


def make_multiturn_sampler(ctx: Any) -> MultiTurnSampler:
    """``SAMPLERS["multiturn"]`` (and ``group`` when ``env.type`` is set) from a sampler context."""
    cfg = ctx.cfg
    task = getattr(ctx.scorer, "task", None)
    make = build_env_factory(cfg, task, ctx.encoder.system_prompt)
    limits = EpisodeLimits(cfg.env.max_turns, cfg.env.max_tokens or cfg.env.max_turns * cfg.max_completion_length,
                           float(cfg.env.timeout_s))
    return MultiTurnSampler(ctx.engine, ctx.tokenizer, make, limits, ctx.encoder, ctx.pad_token_id)


def episode_sampler_factory(cfg: Any, tokenizer: Any) -> Callable[[Any, Any, Any], MultiTurnSampler] | None:
    """With ``env.type`` set: ``(engine, encoder, scorer) -> MultiTurnSampler`` built from the run's ``env:``
    exactly as training builds it (:func:`make_multiturn_sampler`), for
    :func:`rlvr.eval.evaluate.evaluate`'s ``make_sampler`` (``rlvr eval`` and ``rlvr compare``'s held-out
    evaluation); else None. The config must have been checked (:func:`check_env_config`)."""
    if getattr(cfg, "env", None) is None or cfg.env.type is None:
        return None
    from rlvr.samplers.context import SamplerContext

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return lambda engine, encoder, scorer: make_multiturn_sampler(
        SamplerContext(cfg, engine, encoder, scorer, tokenizer, pad))
