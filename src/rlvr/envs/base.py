"""The environment protocol: what a multi-turn episode asks of an environment object.

An environment is one object per trajectory, made by a factory (a class, called with the YAML
``env:`` keyword arguments). The sampler (:mod:`rlvr.samplers.multiturn`) drives it:

* ``reset(problem) -> list[dict]``: the opening chat messages (``{"role": ..., "content": ...}``);
* ``step(action: str) -> Step``: the model's turn as text (special tokens removed); the answer
  carries the next observation (chat messages, empty when done), a reward (summed into the
  trajectory's reward), ``done``, and optional ``feedback`` / ``info``;
* ``close()`` (optional), called once when the episode ends, however it ends.

Each method may be plain or ``async``. Optional class attributes the sampler reads: ``tools`` (JSON
schemas passed to the chat template's ``tools=``), ``observation_roles`` (roles the append-only check
of the chat template probes; default ``("user",)``) and ``reward_name`` (the key of the reward under
``rewards/<name>/*``; default ``"env"``).

Source: issue 26 item 1; the shape follows gym's ``reset``/``step`` and SkyRL's ``BaseTextEnv``
(interpretation: messages in, text out, because the chat template owns the rendering).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from rlvr.errors import ConfigError
from rlvr.registry import Registry

__all__ = ["ENVS", "Environment", "Step", "env_factory", "resolve_env_class"]


@dataclass
class Step:
    """What ``env.step(action)`` returns.

    Attributes:
        observation: chat messages appended after the model's turn (``[]`` when ``done``).
        reward: this turn's reward (float; the trajectory's reward is the sum over its turns).
        done: the episode is over (the sampler then steps it no more).
        feedback: optional text for logs (the verifier's feedback).
        info: optional plain data; the sampler reads ``correct`` (bool, the pass/fail of pass-rate
            metrics), ``tool_calls`` and ``tool_errors`` (counts of this turn).
    """

    observation: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    feedback: str | None = None
    info: dict[str, Any] | None = None


class Environment:
    """An optional base class: subclasses implement :meth:`reset` and :meth:`step` (plain or async).

    Any class with those methods works without it (the protocol is structural)."""

    observation_roles: tuple[str, ...] = ("user",)
    reward_name: str = "env"

    def reset(self, problem: Any) -> list[dict[str, Any]]:
        """The opening messages for ``problem``."""
        raise NotImplementedError

    def step(self, action: str) -> Step:
        """Answer the model's turn ``action``."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the episode held (nothing by default)."""


ENVS: Registry[type] = Registry("env.type", "rlvr.envs.ENVS")
"""Built-in environments by name (``single``, ``feedback``, ``tools``); a user's is ``"module:Class"``."""

CONTEXT_ARGS = ("task", "system_prompt")
"""Constructor parameters the factory fills from the run when the class declares them."""


def resolve_env_class(spec: str) -> type:
    """The environment class that ``env.type`` names: a built-in name or ``"module:Class"``.

    Raises:
        ConfigError: (exit 2) an unknown built-in name (with the registered names), a module that
            cannot be imported (with the import error), a missing attribute, or an attribute that is
            not callable.
    """
    if ":" not in spec:
        return ENVS[spec]
    from rlvr.tasks.custom import load_attribute

    obj = load_attribute(spec, "env.type", what="Class")
    if not callable(obj):
        raise ConfigError(f"env.type={spec!r} is a {type(obj).__name__}, not a class or factory")
    return obj


def env_factory(cls: Any, kwargs: dict[str, Any], *, task: Any = None, system_prompt: str | None = None,
                spec: str = "") -> Callable[[], Any]:
    """A zero-argument factory making one environment per trajectory: ``cls(**kwargs)``, plus ``task``
    and ``system_prompt`` for a class whose constructor declares them.

    Raises:
        ConfigError: a keyword the constructor does not take (names it and the accepted ones).
    """
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a builtin or C callable: pass what was given
        params = {}
    open_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    if params and not open_kw:
        bad = [k for k in kwargs if k not in params]
        if bad:
            names = [n for n in params if n not in CONTEXT_ARGS]
            raise ConfigError(f"env.{bad[0]}: {spec or cls!r} takes no argument {bad[0]!r} "
                              f"(it takes: {', '.join(names) or 'none'})")
    extra = {}
    for name, value in (("task", task), ("system_prompt", system_prompt)):
        if name in params and name not in kwargs:
            extra[name] = value
    all_kw = {**kwargs, **extra}

    def make() -> Any:
        return cls(**all_kw)

    return make
