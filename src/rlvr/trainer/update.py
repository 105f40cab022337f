"""One optimizer update on an optimizer batch: micro-batches, gradient accumulation, clipping, step.

Micro-batches are cut from rows sorted by total length, and each one is cut to its own longest row
(:meth:`RolloutBatch.select`), so no row pays for another's padding. With
``loss_norm_scope=global`` the normalisers come from the whole optimizer batch, so the gradient does
not depend on the micro-batch size (``grpo_core.md`` §6).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Mapping, Sequence

import torch

from rlvr.core.aggregation import AggDenominators, compute_denominators
from rlvr.core.masks import combine_masks, loss_weights
from rlvr.core.objective import LossMetricAccumulator, LossSettings, policy_objective
from rlvr.trainer.forward import completion_logprobs, micro_batches
from rlvr.trainer.optim import gradient_params
from rlvr.types import RolloutBatch

MaskFn = Callable[[RolloutBatch, torch.Tensor, torch.Tensor | None], Any]
"""A variant mask hook: ``(micro_batch, logp [n,T], old_logp [n,T] | None) -> {0,1} mask [n,T]``.

It is called on every micro-batch of every update with the current forward's log-probs (which still
carry gradient: detach before using them). Two optional extensions, both general:

* it may return ``(mask, metrics)`` where ``metrics`` maps a name to a ``(numerator, denominator)``
  pair; :func:`policy_update` sums both over the micro-batches and reports ``Σ num / Σ den`` under
  that name (omitted when ``Σ den == 0``);
* an attribute ``denominator`` (``"drop"`` default, or ``"keep"``) says whether the tokens it masks
  leave the loss normalisers (``grpo_core.md`` §5.4: "masked tokens are dropped from both numerators
  and denominators") or stay counted in them (the normaliser of the mask-free ``W``).
"""


def micro_loss_inputs(loss_inputs: Mapping[str, Any], rows: Sequence[int], n_rows: int, width: int) -> dict[str, Any]:
    """The policy-loss inputs of one micro-batch: a tensor whose first dimension is ``n_rows`` (the
    optimizer batch's rows) is row-aligned and cut to ``rows`` (``[N]`` → ``[n]``; ``[N, T]`` →
    ``[n, width]``); every other value is passed as it is (see
    :attr:`rlvr.schedules.base.OptimizerStep.loss_inputs`)."""
    out: dict[str, Any] = {}
    idx = torch.as_tensor(list(rows), dtype=torch.long)
    for k, v in loss_inputs.items():
        if torch.is_tensor(v) and v.dim() >= 1 and v.shape[0] == n_rows:
            v = v[idx]
            if v.dim() >= 2:
                v = v[:, :width]
        out[k] = v
    return out


def _run_mask_hooks(
    fns: Sequence[MaskFn], micro: RolloutBatch, logp: torch.Tensor, sums: dict[str, list[float]]
) -> tuple[list[torch.Tensor], list[torch.Tensor], bool]:
    """Call every mask hook on one micro-batch; add their ``(num, den)`` metrics into ``sums``.

    Returns:
        ``(masks, drop_masks, has_keep)``: all masks ``[n, T]``, those that leave the normalisers,
        and whether any hook asked to stay in them (``denominator = "keep"``).

    Raises:
        ValueError: a hook's ``denominator`` attribute is neither ``"drop"`` nor ``"keep"``.
    """
    masks, drop, has_keep = [], [], False
    for fn in fns:
        out = fn(micro, logp, micro.old_logp)
        if isinstance(out, tuple):
            out, metrics = out
            for k, (num, den) in (metrics or {}).items():
                acc = sums.setdefault(k, [0.0, 0.0])
                acc[0] += float(num)
                acc[1] += float(den)
        mode = getattr(fn, "denominator", "drop")
        if mode not in ("drop", "keep"):
            raise ValueError(f"mask hook {fn!r}: denominator must be 'drop' or 'keep', got {mode!r}")
        masks.append(out)
        if mode == "drop":
            drop.append(out)
        else:
            has_keep = True
    return masks, drop, has_keep


def _normaliser(d: AggDenominators, mode: str) -> float:
    """The scalar a whole optimizer batch's loss is divided by under ``mode`` (``grpo_core.md`` §6)."""
    if mode == "token-sum":
        return 1.0
    if mode == "token-mean":
        return d.token_weight
    return d.num_seqs * d.scale


@dataclass
class UpdateResult:
    """What one optimizer update reports.

    Attributes:
        metrics: ``actor/*`` and ``loss/*`` scalars.
        skipped: the update was skipped because the loss or gradient was not finite.
        tokens: completion tokens processed.
    """

    metrics: dict[str, float]
    skipped: bool
    tokens: int


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    settings: LossSettings,
    *,
    pad_token_id: int,
    rows_per_micro: int,
    loss_norm_scope: str = "global",
    mask_truncated: bool = False,
    max_grad_norm: float | None = 1.0,
    chunk_size: int = 1024,
    extra_mask_fns: Sequence[MaskFn] = (),
    step_optimizer: bool = True,
    loss_inputs: Mapping[str, Any] | None = None,
    share_prompt: bool = True,
    dp: Any = None,
    step_guard: Callable[[], ContextManager[Any]] | None = None,
) -> UpdateResult:
    """Forward/backward over micro-batches of ``batch`` and one optimizer step.

    ``batch.advantages`` must be set; ``batch.old_logp`` may be None (on-policy: ratio ≡ 1). A
    non-finite loss or gradient norm skips the step (gradients are discarded) and reports
    ``skipped=True`` — the caller counts consecutive skips. With ``step_optimizer=False`` the
    accumulated gradients are left in the parameters' ``.grad`` (for tests and custom schedules; under
    ``bf16-master`` in the optimizer's fp32 masters', :func:`rlvr.trainer.optim.gradient_params`).
    ``loss_inputs`` are extra inputs of the registered policy loss (row-aligned tensors are cut per
    micro-batch, :func:`micro_loss_inputs`). The rows' ``sampler_logp`` (when present) go to the objective as ``rollout_logp``: the
    mismatch metrics ``actor/rollout_*`` are always reported and ``settings.rollout_is_mode`` applies the
    truncated-IS correction (:mod:`rlvr.core.rollout_is`). ``share_prompt`` keeps a group's rows together and runs its prompt once per micro-batch
    (exact; :func:`rlvr.trainer.forward.shared_context_hidden`).

    ``dp`` (a :class:`rlvr.distributed.DataParallel`, None in one process) makes the update one part of
    a data-parallel update: the normalisers (``Σ W``, ``B_eff``, the masked-token rescale) are
    all-reduced, so N ranks × B rows give the gradient of one process with N·B rows (global scope);
    gradients are reduced over ranks before clipping, and a non-finite loss on any rank skips the step
    on every rank. Every rank must call it the same number of times (an empty ``batch`` is allowed).

    ``step_guard`` (streaming rollouts, :mod:`rlvr.trainer.streaming`): a context manager factory entered
    once per call around the gradient clip and the optimizer step (the only place the weights change),
    also when the step is skipped, so a generation thread never samples from half-updated weights.

    Raises:
        ValueError: ``batch.advantages`` is missing.
    """
    if batch.advantages is None:
        raise ValueError("policy_update: batch.advantages is not set")
    W_full = loss_weights(batch, mask_truncated=mask_truncated)
    denominators = _global_denominators(W_full, settings, loss_norm_scope, dp)
    groups = micro_batches(batch, rows_per_micro, keep_groups=share_prompt)
    optimizer.zero_grad(set_to_none=True)
    finite, acc, den_parts, mask_sums = _accumulate_gradients(
        model, batch, groups, W_full, settings, denominators, pad_token_id=pad_token_id, chunk_size=chunk_size,
        extra_mask_fns=extra_mask_fns, loss_inputs=loss_inputs, share_prompt=share_prompt,
        scale=dp.loss_scale(loss_norm_scope) if dp is not None else 1.0, dp=dp,
    )
    finite, factor, params = _rescale_for_masks(model, optimizer, settings, denominators, den_parts, finite, dp)
    with (step_guard() if step_guard is not None else contextlib.nullcontext()):
        finite, grad_norm = _clip_and_step(optimizer, params, finite, max_grad_norm, step_optimizer, dp)
    out = acc.result()
    if factor != 1.0:
        out.update({k: v * factor for k, v in out.items() if k.startswith("loss/")})
    for k, (num, den) in mask_sums.items():
        if den > 0:
            out[k] = num / den
    out["actor/grad_norm"] = grad_norm
    out["actor/num_micro_batches"] = float(len(groups))
    return UpdateResult(metrics=out, skipped=not finite, tokens=int(batch.completion_mask.sum()))

def _global_denominators(
    W_full: torch.Tensor, settings: LossSettings, loss_norm_scope: str, dp: Any,
) -> AggDenominators | None:
    """The optimizer batch's loss normalisers from the weights ``W_full`` ``[B, T]`` (``loss_norm_scope=global``;
    summed over ranks under ``dp``), or None for per-micro-batch normalisers."""
    if loss_norm_scope != "global":
        return None
    denominators = compute_denominators(
        W_full, settings.loss_agg_mode, seq_denominator=settings.seq_denominator,
        loss_scale_factor=settings.loss_scale_factor,
    )
    if dp is not None:  # exact global normalisers: Σ over ranks of Σ W and of B_eff
        tw, ns = dp.sum([denominators.token_weight, denominators.num_seqs])
        denominators = AggDenominators(token_weight=tw, num_seqs=ns, scale=denominators.scale,
                                       mode=denominators.mode)
    return denominators


def _accumulate_gradients(
    model: torch.nn.Module, batch: RolloutBatch, groups: list[Any], W_full: torch.Tensor, settings: LossSettings,
    denominators: AggDenominators | None, *, pad_token_id: int, chunk_size: int, extra_mask_fns: Sequence[MaskFn],
    loss_inputs: Mapping[str, Any] | None, share_prompt: bool, scale: float, dp: Any,
) -> tuple[bool, LossMetricAccumulator, list[torch.Tensor], dict[str, list[float]]]:
    """Forward and backward over the micro-batches ``groups`` (row indices of ``batch``), gradients summed in
    ``.grad``. Returns ``(finite, metrics accumulator, den_parts, mask_sums)``: ``finite`` is False when a
    micro-batch's loss was not finite (the loop stops there), ``den_parts`` are ``W ⊙`` the hooks' "drop" masks
    per micro-batch (global scope: the normaliser is corrected afterwards by :func:`_rescale_for_masks`)."""
    acc = LossMetricAccumulator()
    finite = True
    need_entropy_grad = settings.entropy_coef != 0.0
    den_parts: list[torch.Tensor] = []
    mask_sums: dict[str, list[float]] = {}
    accumulating = dp.accumulate(model) if dp is not None else contextlib.nullcontext()
    with accumulating:
        for rows in groups:
            micro = batch.select(rows)
            W = W_full[rows][:, : micro.completion_mask.shape[1]]
            logp, entropy = completion_logprobs(
                model, micro, pad_token_id=pad_token_id, chunk_size=chunk_size, with_entropy=True,
                entropy_grad=need_entropy_grad, share_prompt=share_prompt,
            )
            masks, drop_masks, has_keep = _run_mask_hooks(extra_mask_fns, micro, logp, mask_sums)
            local_den = denominators
            if denominators is not None and masks:
                den_parts.append(combine_masks(W, *drop_masks))
            elif denominators is None and has_keep:  # micro scope: "keep" masks stay in the normaliser
                local_den = settings.denominators(combine_masks(W, *drop_masks))
            loss, metrics = policy_objective(
                logp, micro.old_logp, micro.advantages, W, settings, local_den,
                ref_logp=micro.ref_logp, entropy=entropy, extra_masks=masks,
                loss_kwargs=micro_loss_inputs(loss_inputs, rows, len(batch), micro.completion_mask.shape[1]) if loss_inputs else None,
                rollout_logp=micro.sampler_logp,  # rollout/training mismatch: always measured, corrected when asked
            )
            if denominators is None:
                loss = loss / len(groups)
                metrics = {k: (v / len(groups) if k.startswith("loss/") else v) for k, v in metrics.items()}
            if not torch.isfinite(loss):
                finite = False
                break
            (loss * scale if scale != 1.0 else loss).backward()
            acc.add(metrics)
    return finite, acc, den_parts, mask_sums


def _rescale_for_masks(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, settings: LossSettings, denominators: AggDenominators | None,
    den_parts: list[torch.Tensor], finite: bool, dp: Any,
) -> tuple[bool, float, list[torch.nn.Parameter]]:
    """Correct the accumulated gradient for the hooks' "drop" masks and (``dp``) reduce it over ranks.

    Global scope: the normalisers were computed before the forward, from W without the hooks' masks. The loss
    is linear in 1/normaliser, so rescaling the accumulated gradient afterwards gives exactly the loss normalised
    over W ⊙ "drop" masks (masks known only after the forward). Returns ``(finite, factor, params)``: ``finite``
    is False when any rank failed, ``factor`` the rescale applied, ``params`` the tensors holding the gradient
    (:func:`rlvr.trainer.optim.gradient_params`: the trainable parameters after the reduction, FSDP's shards, or
    the optimizer's fp32 masters under ``bf16-master``).
    """
    factor = 1.0
    any_masks = bool(den_parts)
    actual_den = settings.denominators(den_parts) if den_parts else None
    if dp is not None:  # one all-reduce: did any rank fail, and the masked normalisers of all ranks
        bad, tw, ns, masked = dp.sum([
            0.0 if finite else 1.0, actual_den.token_weight if actual_den else 0.0,
            actual_den.num_seqs if actual_den else 0.0, 1.0 if den_parts else 0.0,
        ])
        finite, any_masks = bad == 0, masked > 0
        if any_masks and denominators is not None:
            actual_den = AggDenominators(token_weight=tw, num_seqs=ns, scale=denominators.scale,
                                         mode=denominators.mode)
        dp.reduce_gradients(model)  # every rank, even when skipping: the reduction is a collective
    params = gradient_params(model, optimizer)  # after the reduction (FSDP: the shards; bf16-master: the masters)
    if finite and denominators is not None and any_masks and actual_den is not None:
        used = _normaliser(denominators, settings.loss_agg_mode)
        actual = _normaliser(actual_den, settings.loss_agg_mode)
        factor = used / actual if used > 0 and actual > 0 else 1.0  # 0 tokens left: the gradient is 0
        if factor != 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(factor)
    return finite, factor, params


def _clip_and_step(
    optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], finite: bool, max_grad_norm: float | None,
    step_optimizer: bool, dp: Any,
) -> tuple[bool, float]:
    """Clip the gradient norm (over ranks under ``dp``), step when it is finite (and ``step_optimizer``), and
    clear the gradients unless they are kept for the caller. Returns ``(finite, grad_norm)`` (NaN: not computed)."""
    grad_norm = math.nan
    if finite and dp is not None:
        grad_norm = dp.grad_norm_clip(params, max_grad_norm)
        finite = math.isfinite(grad_norm)
    elif finite:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm else math.inf)
        grad_norm = float(norm)
        finite = math.isfinite(grad_norm)
    if finite and step_optimizer:
        optimizer.step()
    if step_optimizer or not finite:
        optimizer.zero_grad(set_to_none=True)
    return finite, grad_norm

