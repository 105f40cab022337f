"""A transformers-based generation engine, tuned for CPU.

:class:`HFEngine` runs its own decode loop over a transformers causal LM instead of calling
``model.generate``:

* **shared prefill** — each request's context is run once; its KV-cache row is then copied to the
  request's ``n`` sample rows (``n`` samples never recompute the same prompt);
* **shrinking batch** — rows that sampled EOS leave the batch (KV cache rows selected away, a few
  finishes batched per compaction), so the step cost follows the rows still alive, not the longest
  one; left-padding columns that no live row needs any more are cut off the cache as well;
* **append-in-place KV cache** — full-attention layers write new keys/values into preallocated
  capacity rather than ``torch.cat``-ing the whole cache every step (a ~0.5 GB copy per step at
  64 rows × 200 tokens on SmolLM2-135M);
* **exact behaviour log-probs** — each sampled token's natural-log probability under the
  distribution it was drawn from (temperature, then top-k, then top-p, renormalised; the order of
  transformers' logits warpers);
* **generation precision from the policy** — with ``precision`` whose ``generation_dtype`` differs from
  the model's weights (``model.dtype: bf16``: fp32 master weights, bf16 decode), the engine decodes with
  a bf16 copy of the weights (half the weight and KV-cache bytes per decode step), re-cast before each
  generation round of a new policy version (:meth:`HFEngine.sync_weights`; the trainer calls it); the
  behaviour log-probs are then those of the bf16 model that sampled. With the policy's
  ``generation_autocast`` (``bf16`` only) it decodes instead from the fp32 master weights under the trainer's
  own autocast (one cast of each weight per :meth:`HFEngine.generate` call, autocast's cache), and with
  ``lm_head_fp32`` it computes the next-token logits in float32 from the master head weight, as the
  trainer's log-softmax then does (:class:`rlvr.precision.PrecisionPolicy`).

Padding: contexts are left-padded; the attention mask hides the pads and explicit position ids
(count of real tokens before a position) make a row's numbers independent of its batch-mates.

Module layout: sampling lives in :mod:`rlvr.engines.sampling` and the KV caches in
:mod:`rlvr.engines.kv_cache`.

Speed measurements and the comparison with ``model.generate`` and continuous batching are in
``benchmarks/bench_generate.py`` / ``benchmarks/results/bench_generate.json``.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Mapping, Sequence

import torch

from rlvr.engines.base import engine_eos_ids
from rlvr.engines.kv_cache import new_cache
from rlvr.engines.kv_reuse import KVStore, lookup, prime_cache, save_rows
from rlvr.engines.sampling import sample_from_logits
from rlvr.types import Generation, GenerationRequest, SamplingParams, validate_requests, validate_sampling

__all__ = ["HFEngine", "sample_from_logits", "validate_sampling"]


# --------------------------------------------------------------------------------------------------
# decode copy in another dtype


def _param_fingerprint(model: Any) -> tuple:
    """``(data_ptr, version)`` of every parameter: changes whenever a parameter is replaced or updated in place."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def _cast_copy(model: Any, dtype: torch.dtype) -> Any:
    """A deep copy of ``model`` with its floating-point parameters in ``dtype``, no gradients.

    Buffers keep their dtype (rotary ``inv_freq`` stays float32, as transformers computes it), and tied
    parameters stay tied (``deepcopy`` keeps the sharing; the cast is done per parameter object).
    """
    import copy

    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            if p.is_floating_point():
                p.data = p.data.to(dtype)
            p.grad = None
            p.requires_grad_(False)
    clone.eval()
    return clone


def _contiguous_input(_module: Any, args: tuple) -> tuple:
    """Forward pre-hook: the module's first input made contiguous (see :meth:`HFEngine._forward`)."""
    return (args[0].contiguous(), *args[1:])


# --------------------------------------------------------------------------------------------------
# engine


class HFEngine:
    """Sample continuations from a transformers causal LM (any device; tuned for CPU).

    Args:
        model: a ``*ForCausalLM`` (llama-like: accepts ``attention_mask``, ``position_ids``, a
            ``Cache``). The engine holds the module itself, not a copy: when the trainer updates this
            same module in place (colocated training, the default), the engine samples from the new
            weights with no sync at all, and :meth:`load_weights` is a no-op for those tensors.
        tokenizer: its tokenizer; used only for ``pad_token_id`` and ``eos_token_id``.
        max_batch_size: most sequences decoded together (memory and cache-copy cost grow with it).
            Requests are packed into chunks of at most this many rows, shorter contexts together.
        eos_token_ids: ids that end a sequence; default: the tokenizer's eos plus the model's
            ``generation_config.eos_token_id`` (int or list).
        cache: ``"append"`` (default; preallocated in-place KV appends) or ``"dynamic"``
            (transformers' ``DynamicCache`` as is: one ``torch.cat`` per layer per step).
        prune: drop finished rows from the batch (default True). Compaction copies the live KV
            cache, so it is batched: it runs once the row-steps spent on finished rows since the
            last compaction reach :attr:`prune_patience` (ski-rental rule; a row-step of a
            135 M model costs about as much as compacting ~1/8 of its cache). False keeps finished
            rows until the whole chunk ends, as ``model.generate`` does (for benchmarks).
        precision: a :class:`rlvr.precision.PrecisionPolicy`; default: the one attached to ``model``
            (:func:`rlvr.precision.model_precision`), or none (decode in the model's own dtype).
            When its ``generation_dtype`` is not the dtype of the model's floating-point parameters, the
            engine keeps a copy of the model with parameters in that dtype (buffers such as rotary
            frequencies untouched) and keeps it in sync (see :meth:`sync_weights`).
        continuous: continuous batching (:mod:`rlvr.engines.continuous`): when rows finish, waiting
            requests take their slots instead of waiting for the chunk's longest row. Greedy results are
            the chunked loop's up to float rounding (under bf16 near-tied argmaxes can flip); seeded
            sampling is reproducible but draws differently (module docstring).

    Attributes:
        eos_token_ids: ``set[int]``.
        prune_patience: row-steps of finished rows tolerated before the batch is compacted
            (default 8; 1 compacts at every finish).
        pad_token_id: id used for left padding (its value never reaches the model's output: the
            attention mask hides it).
        decode_gate: ``None`` (default: the weights are fixed for a whole call) or a
            :class:`rlvr.engines.partial.DecodeGate` asked between decode steps whether the weights changed
            (partial rollouts: the rows' KV caches are recomputed and each token records its version).

    Raises:
        ValueError: ``max_batch_size < 1``, unknown ``cache``, or no EOS id can be found.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        eos_token_ids: set[int] | Sequence[int] | None = None,
        cache: str = "append",
        prune: bool = True,
        precision: Any = None,
        continuous: bool = False,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if cache not in ("append", "dynamic"):
            raise ValueError(f"cache must be 'append' or 'dynamic', got {cache!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.on_generated: Callable[[int], None] | None = None  # called with the rows of each finished chunk
        self.decode_gate: Any = None  # partial rollouts (rlvr.engines.partial): weights may change between steps
        self.cache_kind = cache
        self.prune = prune
        self.continuous = continuous
        if precision is None:
            from rlvr.precision import model_precision

            precision = model_precision(model)
        self.precision = precision
        self._decode_model: Any = model  # the module decode runs (a cast copy under a bf16 policy)
        self._synced: tuple | None = None  # (data_ptr, _version) of every source parameter at the last sync
        self._synced_version: int | None = None  # the policy version of the last versioned sync
        want = getattr(precision, "generation_dtype", None)
        have = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        self._autocast = bool(getattr(precision, "decodes_under_autocast", False))
        self._head_fp32 = bool(getattr(precision, "lm_head_fp32", False))
        self._head: tuple[torch.Tensor, torch.Tensor | None] | None = None  # fp32 head, set per generate call
        if want is not None and have is not None and want != have:
            self._decode_model = _cast_copy(model, want)
            self._synced = _param_fingerprint(model)
        self.prune_patience = 8
        self._kv: KVStore | None = None  # saved rows' KV caches inside kv_session()
        if eos_token_ids is None:
            eos_token_ids = engine_eos_ids(model, tokenizer)
        self.eos_token_ids: set[int] = {int(i) for i in eos_token_ids}
        if not self.eos_token_ids:
            raise ValueError("HFEngine: no EOS token id (tokenizer and generation_config have none); pass eos_token_ids")
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id: int = int(pad) if pad is not None else min(self.eos_token_ids)
        params = inspect.signature(self._decode_model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params
        if self._head_fp32:
            from rlvr.models.split import decoder_of

            self._decoder = decoder_of(self._decode_model)
            self._decoder_cache_kw = ("cache" if "cache" in inspect.signature(self._decoder.forward).parameters
                                      else "past_key_values")

    # ---------------------------------------------------------------------------------------------
    def load_weights(self, state_dict: Mapping[str, torch.Tensor] | Any) -> None:
        """Copy ``state_dict`` into the engine's model, skipping tensors that already are its own.

        When the engine holds the very module being trained (colocated; the default wiring), every
        tensor of ``model.state_dict()`` is the engine's own storage, so this is a no-op: the
        trainer's in-place optimizer steps are already visible. A partial dict updates only its keys.

        Args:
            state_dict: name → tensor (names as in ``model.state_dict()``); a module is accepted too.

        Raises:
            KeyError: names the model does not have (all listed).
            ValueError: a tensor of the wrong shape.
        """
        if isinstance(state_dict, torch.nn.Module):
            if state_dict is self.model:
                self.sync_weights(force=True)
                return
            state_dict = state_dict.state_dict()
        own = self.model.state_dict()
        unknown = [k for k in state_dict if k not in own]
        if unknown:
            raise KeyError(f"load_weights: the engine's model has no tensors named {unknown[:10]}")
        with torch.no_grad():
            for name, src in state_dict.items():
                dst = own[name]
                if src.data_ptr() == dst.data_ptr() and src.shape == dst.shape:
                    continue  # the same storage: nothing to copy
                if src.shape != dst.shape:
                    raise ValueError(f"load_weights: {name} has shape {tuple(src.shape)}, model has {tuple(dst.shape)}")
                dst.copy_(src)
        self.sync_weights(force=True)

    # ---------------------------------------------------------------------------------------------
    @property
    def decode_dtype(self) -> torch.dtype:
        """dtype of the weights the decode loop runs with."""
        return next(p.dtype for p in self._decode_model.parameters() if p.is_floating_point())

    @property
    def casts_weights(self) -> bool:
        """True when the engine decodes from its own cast copy of :attr:`model` (which then needs syncs)."""
        return self._decode_model is not self.model

    def sync_weights(self, force: bool = False, *, version: int | None = None) -> bool:
        """Re-cast the decode copy from :attr:`model` when it may be stale; a no-op without a cast copy.

        With ``version`` (the trainer's optimizer-step count, passed before every generation round) the
        copy is refreshed whenever the version differs from the last one synced: that is the reliable
        signal, because torch's fused AdamW updates parameters without bumping their version counters.
        Without it (``generate`` calls this itself) a parameter whose storage pointer or version counter
        changed since the last sync triggers the refresh — enough for plain in-place updates and
        ``load_state_dict``; ``force=True`` always refreshes.

        Returns:
            True when the copy was refreshed.
        """
        if self._decode_model is self.model:
            return False
        fp = _param_fingerprint(self.model)
        if version is not None:
            force = force or version != self._synced_version
        if not force and fp == self._synced:
            return False
        with torch.no_grad():
            for src, dst in zip(self.model.parameters(), self._decode_model.parameters()):
                dst.copy_(src)
        self._synced = fp
        if version is not None:
            self._synced_version = version
        return True

    # ---------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def kv_session(self):
        """Inside it, each sample row's KV cache is kept when the row finishes, and a later request whose
        context starts with a kept row's tokens prefills only the rest (:mod:`rlvr.engines.kv_reuse`): the
        later turns of multi-turn episodes (:class:`rlvr.samplers.multiturn.MultiTurnSampler` opens one
        session per generation round). The weights must not change inside a session; the kept caches are
        dropped at its end. Both decode modes keep and reuse rows (the save is in the one decode loop,
        :func:`rlvr.engines.continuous.decode_pieces`). Yields the session's
        :class:`rlvr.engines.kv_reuse.KVStore` (``hits``, ``reused_tokens``: how much was not recomputed).
        """
        outer = self._kv
        self._kv = KVStore()
        try:
            yield self._kv
        finally:
            self._kv = outer

    # ---------------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Generation]]:
        """Draw ``request.n`` continuations of each request's context.

        Sampling runs under ``torch.inference_mode()`` with the model in eval mode (dropout off);
        the module's previous train/eval mode is restored afterwards, also on error.
        With ``params.seed`` set, a private ``torch.Generator`` makes the result a function of
        (model weights, requests, params, max_batch_size) only.

        Args:
            requests: contexts (non-empty token-id sequences) and sample counts.
            params: sampling parameters (validated by :func:`validate_sampling`).

        Returns:
            ``out[i]`` is a list of ``requests[i].n`` :class:`Generation`: new token ids only
            (EOS included when sampled), ``[L]`` behaviour log-probs (natural log, see
            :func:`sample_from_logits`), ``finish_reason`` ``"eos"`` or ``"length"``
            (``L`` == the request's ``max_new_tokens``, else the call's).

        Raises:
            ValueError: an empty context, ``n < 1``, a request cap outside ``[1, params.max_new_tokens]``,
                or invalid ``params``.
        """
        validate_sampling(params)
        validate_requests(requests, params)
        results: list[list[Generation | None]] = [[None] * r.n for r in requests]
        if not requests:
            return []
        self.sync_weights()
        model = self._decode_model
        generator = None
        if params.seed is not None:
            device = next(model.parameters()).device
            generator = torch.Generator(device=device).manual_seed(int(params.seed))
        was_training = model.training
        model.eval()
        if self._head_fp32:  # the master head weight (a no-op .float() for fp32 masters), once per call
            from rlvr.models.split import lm_head_params

            w, b = lm_head_params(self.model)
            self._head = (w.detach().float(), b.detach().float() if b is not None else None)
        precision_ctx = self.precision.autocast_context() if self._autocast else contextlib.nullcontext()
        try:
            with torch.inference_mode(), precision_ctx:  # one autocast region: each weight cast once per call
                if self.continuous:
                    from rlvr.engines.continuous import run_continuous

                    run_continuous(self, requests, params, generator, results)
                    return results  # type: ignore[return-value]
                for chunk in self._plan(requests):
                    self._run_chunk(requests, chunk, params, generator, results)
                    if self.on_generated is not None:  # progress (rlvr.trainer): rows finished
                        self.on_generated(sum(len(samples) for _, samples in chunk))
                if self._kv is not None:
                    self._kv.free_used()
        finally:
            model.train(was_training)
            self._head = None
        return results  # type: ignore[return-value]

    # ---------------------------------------------------------------------------------------------
    def _plan(self, requests: Sequence[GenerationRequest]) -> list[list[tuple[int, list[int]]]]:
        """Pack (request, sample indices) pieces into chunks of ≤ ``max_batch_size`` rows.

        Requests are visited by context length so that a chunk's rows need little padding; a request
        with more samples than fit is split across chunks (its context is then prefilled once per chunk).
        """
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].context_ids))
        chunks: list[list[tuple[int, list[int]]]] = []
        cur: list[tuple[int, list[int]]] = []
        rows = 0
        for i in order:
            samples = list(range(requests[i].n))
            while samples:
                take = min(len(samples), self.max_batch_size - rows)
                cur.append((i, samples[:take]))
                samples = samples[take:]
                rows += take
                if rows == self.max_batch_size:
                    chunks.append(cur)
                    cur, rows = [], 0
        if cur:
            chunks.append(cur)
        return chunks

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        """One cached forward; returns last-position logits ``[B, V]`` (float32 from the fp32 head when the
        policy asks for ``lm_head_fp32``: the decoder's last hidden state ``[B, H]`` upcast, times the master
        weight, autocast off).

        Otherwise a prefill (more than one new position) hands the model's LM head the last position as a
        strided view ``[B, 1, H]`` of ``[B, S, H]``; ``torch.matmul`` does not fold such an input into one
        matrix product and broadcasts the head's weight to ``[B, H, V]`` instead, a copy of ``B × H × V``
        elements (1.8 GB for 32 rows of SmolLM2, seconds per prefill on a CPU, measured in
        ``benchmarks/bench_envs.py``). A pre-hook on the head makes that input contiguous for the prefill
        forward only (same values).
        """
        if self._head is not None:
            out = self._decoder(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                                **{self._decoder_cache_kw: cache})
            h = out.last_hidden_state[:, -1, :]
            w, b = self._head
            with torch.autocast(h.device.type, enabled=False):
                z = h.float() @ w.t()
                return z if b is None else z + b
        kw: dict[str, Any] = {self._cache_kw: cache}
        if self._has_logits_to_keep:
            kw["logits_to_keep"] = 1
        head = self._decode_model.get_output_embeddings() if ids.shape[1] > 1 else None
        hook = head.register_forward_pre_hook(_contiguous_input) if isinstance(head, torch.nn.Module) else None
        try:
            out = self._decode_model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **kw)
        finally:
            if hook is not None:
                hook.remove()
        return out.logits[:, -1, :]

    def _prefill(self, requests: Sequence[GenerationRequest], chunk: list[tuple[int, list[int]]],
                 params: SamplingParams) -> tuple[Any, bool, torch.Tensor, torch.Tensor, torch.Tensor,
                                                  list[tuple[int, int]], torch.Tensor]:
        """Prefill the contexts of ``chunk`` (left-padded, each context once) and give every sample its row.

        Returns:
            ``(cache, trimmable, logits [B, V], mask [B, W], lens [B] (CPU), owners, row_cap [B])``: one row
            per (request, sample) in ``owners`` order; the cache holds ``W`` positions with capacity for
            the chunk's longest cap.
        """
        device = next(self._decode_model.parameters()).device
        contexts = [list(requests[i].context_ids) for i, _ in chunk]
        lens = torch.tensor([len(c) for c in contexts], dtype=torch.long)
        hits = [lookup(self._kv, c) for c in contexts] if self._kv is not None and self._kv.rows else []
        kept = [n for n, _ in hits] if any(n for n, _ in hits) else [0] * len(contexts)
        new = [c[n:] for c, n in zip(contexts, kept)]  # what this prefill computes
        width = max(len(c) for c in new)
        r = len(contexts)
        ids = torch.full((r, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((r, width), dtype=torch.long)
        for j, c in enumerate(new):  # left padding
            ids[j, width - len(c) :] = torch.tensor(c, dtype=torch.long)
            mask[j, width - len(c) :] = 1
        ids, mask = ids.to(device), mask.to(device)

        req_caps = [requests[i].max_new_tokens or params.max_new_tokens for i, _ in chunk]
        cache, trimmable = new_cache(self._decode_model.config, max(kept) + width + max(req_caps), self.cache_kind)
        if max(kept):  # kept rows first (right-aligned), then the new tokens: [pad | kept | pad | new]
            mask = torch.cat([prime_cache(cache, [s for _, s in hits], kept, mask), mask], dim=1)
            self._kv.hits += sum(n > 0 for n in kept)
            self._kv.reused_tokens += sum(kept)
            self._kv.used.update(tuple(c[:n]) for c, n in zip(contexts, kept) if n)
        pos = ((mask.cumsum(-1) - 1).clamp_min(0))[:, mask.shape[1] - width:]
        logits = self._forward(ids, mask, pos, cache)  # [R, V]

        # one row per sample: copy each context's cache row to its samples
        counts = torch.tensor([len(s) for _, s in chunk], dtype=torch.long)
        owners = [(i, s) for i, samples in chunk for s in samples]  # row → (request, sample)
        row_cap = torch.tensor([c for c, (_, samples) in zip(req_caps, chunk) for _ in samples], device=device)  # [B]
        if int(counts.max()) > 1:
            expand = torch.repeat_interleave(torch.arange(r), counts).to(device)  # [B]
            cache.batch_select_indices(expand)
            logits, mask, lens = logits[expand], mask[expand], lens[expand.cpu()]
        return cache, trimmable, logits, mask, lens, owners, row_cap

    def _run_chunk(
        self,
        requests: Sequence[GenerationRequest],
        chunk: list[tuple[int, list[int]]],
        params: SamplingParams,
        generator: torch.Generator | None,
        results: list[list[Generation | None]],
    ) -> None:
        """Decode one chunk of :meth:`_plan` (at most ``max_batch_size`` rows): prefill, then the shrinking
        batch until every row has finished (:func:`rlvr.engines.continuous.decode_pieces`, which given one
        chunk never admits anything after its prefill)."""
        from rlvr.engines.continuous import decode_pieces

        decode_pieces(self, requests, chunk, params, generator, results)
