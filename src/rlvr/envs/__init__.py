"""Environments: multi-turn episodes and tool calls on the GRPO seam (``env:`` in the config).

The protocol (:mod:`rlvr.envs.base`): one object per trajectory with ``reset(problem) -> messages``
and ``step(action) -> Step``, optional ``close()``, plain or async. Built-in ones by name
(:data:`ENVS`: ``single``, ``feedback``, ``tools``), a user's as ``"my_module:MyEnv"``. The sampler that
runs them token-in/token-out is :mod:`rlvr.samplers.multiturn`; the contract and the masking rules
are in ``docs/environments.md``.
"""

from rlvr.envs.base import ENVS, Environment, Step, env_factory, resolve_env_class
from rlvr.envs import builtin, tools  # noqa: F401 (registers the built-in environments)
from rlvr.envs import python_tool  # noqa: F401 (registers the built-in python tool)
from rlvr.envs.builtin import FeedbackEnv, SingleTurnEnv
from rlvr.envs.tools import TOOL_PARSERS, TOOLS, ToolEnv, calculator

__all__ = ["ENVS", "TOOLS", "TOOL_PARSERS", "Environment", "FeedbackEnv", "SingleTurnEnv", "Step", "ToolEnv",
           "calculator", "env_factory", "resolve_env_class"]
