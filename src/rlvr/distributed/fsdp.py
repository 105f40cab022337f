"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for a causal LM trained by rlvr's own forward.

Layout: ``fully_shard`` on every decoder layer, then on a root :class:`ForwardRunner` that holds the
policy, so the embedding, final norm and LM head (rlvr computes log-probs from hidden states with its
own chunked head, never through ``model.forward``) are one root parameter group that is gathered when
any trainer forward runs through the root.

Collective discipline. Ranks hold different rows, so the number of forward calls per update differs
between ranks (micro-batch counts, shared-prompt length buckets). FSDP's per-forward all-gathers would
then pair up wrongly. So rlvr drives FSDP2 explicitly through its public API:

* every FSDP module has ``reshard_after_forward=False``;
* an update (:func:`unsharded`) all-gathers every parameter group once, in module order, with gradient
  sync and post-backward resharding off, so micro-batch forwards and backwards issue no collective;
* :func:`reduce_gradients` then turns gradient sync on and runs one fixed-shape dummy forward/backward
  (zero loss) through the root: every group's post-backward hook reduce-scatters the accumulated
  gradient exactly once, on every rank, and reshards.

Memory: parameters and gradients are whole during an update (ZeRO-2-like peak for them) while the
optimizer state and the fp32 master copy stay sharded (``1/world`` each). Interpretation: this trades
the per-layer re-gather of textbook FSDP for ranks that may run different numbers of forwards.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

__all__ = ["ForwardRunner", "shard_policy", "fsdp_modules", "unsharded", "reduce_gradients", "mixed_precision_for"]

RUNNER_ATTR = "rlvr_forward_runner"
"""Attribute set on a sharded policy: its root :class:`ForwardRunner` (read by ``trainer.forward``)."""


class ForwardRunner(torch.nn.Module):
    """The FSDP root: ``runner(fn, *args, **kw)`` computes ``fn(policy, *args, **kw)`` inside the root's
    forward, so FSDP's root hooks (gathering embedding, norm and head; queuing the post-backward
    callback) run around rlvr's own forward code.

    Args:
        policy: the causal LM (a submodule: its parameters are the root's).
    """

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(self.policy, *args, **kwargs)``."""
        return fn(self.policy, *args, **kwargs)


def mixed_precision_for(device: torch.device, policy: Any = None) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for the run's precision policy (:mod:`rlvr.precision`).

    On CUDA under ``bf16`` (fp32 master weights, bf16 matmuls): ``param_dtype=policy.compute_dtype``,
    ``reduce_dtype=policy.reduce_dtype`` (fp32) — FSDP gathers bf16 parameters and reduces fp32 gradients.
    Otherwise ``None``: fp32 throughout on CPU (issue 14: fp32 on CPU), and the pure modes already store
    the weights in their compute dtype.

    Source: PyTorch FSDP2 docs (``MixedPrecisionPolicy``); torchtitan's default (bf16 params, fp32 reduce).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type != "cuda" or policy is None or getattr(policy, "mode", None) != "bf16":
        return None
    return MixedPrecisionPolicy(param_dtype=policy.compute_dtype, reduce_dtype=policy.reduce_dtype)


def _decoder_layers(policy: torch.nn.Module) -> list[torch.nn.Module]:
    names = set(getattr(policy, "_no_split_modules", None) or ())
    layers = [m for m in policy.modules() if type(m).__name__ in names]
    if not layers:
        base = getattr(policy, "model", None)
        layers = list(getattr(base, "layers", []) or [])
    if not layers:
        raise ValueError(f"{type(policy).__name__}: no decoder layers found to shard (no _no_split_modules, no model.layers)")
    return layers


def shard_policy(
    policy: torch.nn.Module, *, device: torch.device, mp_policy: Any = None, mesh: Any = None,
) -> ForwardRunner:
    """Apply FSDP2 to ``policy`` in place and return its root :class:`ForwardRunner`.

    The policy's parameters become sharded ``DTensor`` s (build the optimizer after this call); the
    policy gets the attribute :data:`RUNNER_ATTR` so that :func:`rlvr.trainer.forward.completion_logprobs`
    routes through the root. A collective: every rank calls it (it runs one warm-up forward). Activation checkpointing, if wanted, must be enabled on ``policy`` before
    (``gradient_checkpointing_enable``; it composes with FSDP2).

    Args:
        policy: a causal LM on CPU or ``device``.
        device: this rank's device (the mesh's device type).
        mp_policy: a ``MixedPrecisionPolicy`` or ``None`` (see :func:`mixed_precision_for`).
        mesh: a 1-D ``DeviceMesh`` (default: the whole world on ``device.type``).

    Raises:
        ValueError: no decoder layers found.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if mesh is None:
        mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
    kw: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": False}
    if mp_policy is not None:
        kw["mp_policy"] = mp_policy
    for layer in _decoder_layers(policy):
        fully_shard(layer, **kw)
    root = ForwardRunner(policy)
    fully_shard(root, **kw)
    object.__setattr__(policy, RUNNER_ATTR, root)  # not a submodule: no cycle in modules()/state_dict()
    # FSDP makes the first module to run forward its root: run one tiny forward through `root` now, so a
    # later forward that enters the policy directly (the engine generating on gathered weights) is fine
    with torch.no_grad(), unsharded(root, training=False):
        root(_dummy_loss, 0)
    return root


def fsdp_modules(root: torch.nn.Module) -> list[Any]:
    """Every ``FSDPModule`` under ``root`` (itself included), in module order (the same on every rank)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in root.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def unsharded(root: torch.nn.Module, *, training: bool) -> Iterator[None]:
    """Gather every parameter group of ``root`` once (one all-gather each, module order), run the body
    with no further collective, then (``training=False``) reshard.

    With ``training=True`` gradient sync and post-backward resharding are off inside, so micro-batch
    backwards only accumulate; call :func:`reduce_gradients` after the body (it reshards).
    """
    mods = fsdp_modules(root)
    if training:
        for m in mods:
            m.set_requires_gradient_sync(False, recurse=False)
            m.set_reshard_after_backward(False, recurse=False)
    for m in mods:
        m.unshard()
    try:
        yield
    finally:
        if not training:
            for m in mods:
                m.reshard()


def _dummy_loss(policy: torch.nn.Module, pad_token_id: int) -> torch.Tensor:
    from rlvr.models.split import lm_head_params, model_forward_hidden

    weight, bias = lm_head_params(policy)
    ids = torch.full((1, 2), int(pad_token_id), dtype=torch.long, device=weight.device)
    h = model_forward_hidden(policy, ids, torch.ones_like(ids))[:, -1]
    logits = h @ weight.T if bias is None else h @ weight.T + bias
    return logits.float().sum() * 0.0


def reduce_gradients(root: torch.nn.Module, pad_token_id: int) -> None:
    """Reduce-scatter the gradients accumulated under :func:`unsharded` (``training=True``): one
    zero-loss forward/backward of fixed shape through the root, with gradient sync on, so every
    parameter group of every rank runs its post-backward reduction exactly once. FSDP averages over
    ranks; the caller scales each rank's loss by the world size to get the sum. Reshards afterwards.
    """
    mods = fsdp_modules(root)
    for m in mods:
        m.set_requires_gradient_sync(True, recurse=False)
        m.set_reshard_after_backward(True, recurse=False)
    pad = pad_token_id
    with torch.enable_grad():
        root(_dummy_loss, pad).backward()
