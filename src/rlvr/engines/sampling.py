"""Token sampling for the transformers engine: temperature → top-k → top-p, with exact log-probs.

:func:`sample_from_logits` draws one token per row and returns its log-probability under the very
distribution it was drawn from (the behaviour log-probs the trainer's importance ratios need). Split out of
:mod:`rlvr.engines.hf` because it is pure tensor code with its own tests, used by
every decode step but by nothing else of the engine.
"""

from __future__ import annotations

import torch

__all__ = ["sample_from_logits"]


def sample_from_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and return its log-probability under the distribution sampled from.

    The distribution is ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely
    tokens (0: no restriction) and renormalised, then restricted to the smallest most-likely set
    whose mass reaches ``top_p`` (the token that crosses ``top_p`` is kept; at least one token always
    is) and renormalised. ``temperature == 0`` (any ``top_p``/``top_k``) and ``top_k == 1`` are greedy:
    the argmax of the raw logits, log-prob 0 (the log of the point mass it was drawn from), and no
    randomness is consumed. Ties go to the lowest token id (``torch.argmax`` returns the first
    maximal index); every engine follows this contract (:class:`rlvr.engines.base.Engine`).

    Draws use the inverse CDF with one uniform per row (float64 cumulative sum): on CPU this is
    ~10× cheaper than ``torch.multinomial`` or an exponential race over a 49 k vocabulary, which
    need one random number per vocabulary entry. top-p alone avoids a full sort: it takes the top
    256 (then 2 048, ...) candidates and widens only if their mass is below ``top_p`` in some row.

    Args:
        logits: ``[B, V]`` next-token logits (any float dtype; computed in float32).
        temperature: >= 0; 0 is greedy (see above).
        top_p: in ``(0, 1]``; 1 disables.
        top_k: ≥ 0; 0 disables.
        generator: private RNG on ``logits.device`` (``None``: torch's global RNG).

    Returns:
        ``(tokens [B] long, logprobs [B] float32)`` — natural log, of the distribution described above.

    Source: temperature → top-k → top-p, the order of transformers' ``TemperatureLogitsWarper``,
    ``TopKLogitsWarper``, ``TopPLogitsWarper`` (ties at the top-k boundary are resolved by
    ``torch.topk``'s order instead of keeping every tied token).
    """
    x = logits.float()
    rows, vocab = x.shape
    if temperature == 0 or top_k == 1:  # greedy: argmax, first (lowest) id on ties
        return x.argmax(-1), torch.zeros(rows, dtype=torch.float32, device=x.device)
    if temperature != 1.0:
        x = x / temperature
    cand: torch.Tensor | None = None  # [B, K] vocabulary ids of the candidates, descending
    if 0 < top_k < vocab:
        x, cand = x.topk(top_k, dim=-1)  # sorted descending; the distribution is now over K
    if top_p < 1.0:
        if cand is None:
            x, cand, norm = _nucleus_candidates(x, top_p)
        else:
            norm = x.logsumexp(-1, keepdim=True)
        probs = (x - norm).exp()
        before = probs.cumsum(-1) - probs  # mass strictly above each candidate
        x = x.masked_fill(before >= top_p, float("-inf"))  # column 0 has before == 0: always kept
    logp = x.log_softmax(-1)  # [B, K or V]
    cdf = logp.exp().double().cumsum(-1)
    u = torch.rand((rows, 1), generator=generator, dtype=torch.float64, device=x.device) * cdf[:, -1:]
    choice = torch.searchsorted(cdf, u, right=True).clamp_max(logp.shape[-1] - 1)  # [B, 1]
    lp = logp.gather(-1, choice)
    bad = torch.isneginf(lp)  # only by float rounding at the very end of the CDF
    if bool(bad.any()):
        choice = torch.where(bad, logp.argmax(-1, keepdim=True), choice)
        lp = logp.gather(-1, choice)
    tokens = choice if cand is None else cand.gather(-1, choice)
    return tokens.squeeze(-1), lp.squeeze(-1)


def _nucleus_candidates(x: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top candidates ``[B, K]`` (descending) that hold at least ``top_p`` of the mass in every row.

    Returns:
        ``(values [B, K], vocabulary ids [B, K], log-normaliser of the full row [B, 1])``.
    """
    vocab = x.shape[-1]
    norm = x.logsumexp(-1, keepdim=True)
    k = min(vocab, 256)
    while True:
        vals, idx = x.topk(k, dim=-1)
        if k == vocab or bool(((vals - norm).exp().sum(-1) >= top_p).all()):
            return vals, idx, norm
        k = min(vocab, k * 8)

