"""The vLLM server engine: the :class:`~rlvr.engines.base.Engine` protocol over vLLM's HTTP API.

Token-in / token-out through the OpenAI-compatible ``POST /v1/completions`` endpoint, which vLLM
extends to take a prompt as token ids and to return the sampled ``token_ids``:

* one HTTP request per :class:`~rlvr.types.GenerationRequest` (its own ``n``, its own
  ``max_tokens`` = the request's ``max_new_tokens`` cap, its own seed), all sent concurrently so
  that the server's continuous batching sees the whole call at once;
* ``logprobs: 0`` returns the sampled token's log-prob; with the server started with
  ``--logprobs-mode processed_logprobs`` (rlvr does so when it owns the server) it is the log-prob
  under the distribution actually sampled from (temperature, then top-k/top-p, renormalised) — the
  behaviour log-prob of :class:`~rlvr.types.Generation`;
* ``stop_token_ids`` = the engine's EOS ids; vLLM keeps the stop token as the last of
  ``token_ids`` and reports ``finish_reason="stop"`` (→ ``"eos"``) or ``"length"``;
* a context that extends an earlier one (tree forks, feedback prompts) is simply a longer prompt:
  vLLM's automatic prefix cache (``--enable-prefix-caching``) reuses the KV blocks of the shared
  prefix.

Greedy (``temperature == 0``) follows the engine contract of :mod:`rlvr.engines.base`: vLLM accepts
``n == 1`` only for greedy, so one continuation is drawn and copied ``n`` times, and each token's
behaviour log-prob is 0.0 (the point mass it was drawn from).

Weights: `VLLMEngine.generation_sync` is the sync point the trainer calls
(:func:`rlvr.engines.weight_sync.sync_policy`), over a transport (filesystem by default).

Seeds (``seed_requests``): vLLM seeds each of a request's ``n`` samples with ``seed + index``; rlvr
derives one seed per request from the call's seed and the request index (far apart, so the streams
never overlap). The server's numerics depend on how it batches, so a seed makes runs repeatable up to
that, not bitwise. Off in the default config: vLLM 0.32's CPU worker crashes on seeded requests whose
prefill is split across steps.

Source: vLLM 0.32 ``vllm/entrypoints/openai/completion/protocol.py`` (``return_token_ids``,
``stop_token_ids``, ``logprobs``), ``vllm/v1/engine/parallel_sampling.py`` (child seeds).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

import torch

from rlvr.engines.vllm_server import VLLMServerError
from rlvr.engines.weight_sync import ServerWeightSync, WeightTransport
from rlvr.types import Generation, GenerationRequest, SamplingParams, validate_requests, validate_sampling

__all__ = ["VLLMClient", "VLLMEngine", "request_seed"]

_SEED_MUL = 6364136223846793005
_SEED_STRIDE = 1442695040888963407


def request_seed(seed: int, index: int) -> int:
    """The seed of request ``index`` of a call seeded with ``seed``: a 62-bit mix, so that the
    per-sample seeds ``seed_i + j`` (vLLM's children) of different requests never coincide in practice."""
    return (int(seed) * _SEED_MUL + (int(index) + 1) * _SEED_STRIDE) % (2**62)


class VLLMClient:
    """A small JSON-over-HTTP client for the endpoints rlvr uses (stdlib only).

    Args:
        url: ``http://host:port`` of the server.
        timeout_s: per-request timeout.

    Raises:
        VLLMServerError: from every call, for a refused connection or an HTTP error; the message
            names the endpoint and quotes the server's answer.
    """

    def __init__(self, url: str, timeout_s: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request; returns the decoded JSON answer (None for an empty body)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:2000]
            raise VLLMServerError(f"vLLM server {self.url}: {method} {path} -> HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            raise VLLMServerError(f"vLLM server {self.url}: {method} {path} failed: {e}") from None
        return json.loads(raw) if raw.strip() else None

    def completions(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /v1/completions``."""
        return self.request("POST", "/v1/completions", dict(body))

    def models(self) -> list[str]:
        """Names the server serves (``GET /v1/models``)."""
        return [m["id"] for m in self.request("GET", "/v1/models")["data"]]

    def pause(self) -> None:
        """``POST /pause?mode=wait``: stop scheduling new work once in-flight requests finish."""
        self.request("POST", "/pause?mode=wait")

    def resume(self) -> None:
        """``POST /resume``."""
        self.request("POST", "/resume")

    def collective_rpc(self, method: str, **kwargs: str) -> Any:
        """``POST /collective_rpc``: call ``method(**kwargs)`` on every worker (string kwargs only)."""
        return self.request("POST", "/collective_rpc", {"method": method, "kwargs": {k: str(v) for k, v in kwargs.items()}})

    def reset_prefix_cache(self) -> None:
        """``POST /reset_prefix_cache``: forget cached KV blocks (computed with the old weights)."""
        self.request("POST", "/reset_prefix_cache")


NEUTRAL_SAMPLING: dict[str, float | int] = {
    "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0,
    "top_p": 1.0, "top_k": -1,
}
"""The sampling fields every request body sets to "off" unless rlvr means to use them (``top_p`` /
``top_k`` are then the run's). vLLM fills a field a request leaves out from the model's
``generation_config.json`` (``--generation-config auto``, its default: Qwen2.5-Instruct's
``repetition_penalty`` 1.1 and ``min_p`` 0.05 were applied to every rollout), so each rollout would be
off-policy against the plain softmax(z/T) the trainer scores, and greedy evaluation would run with a
repetition penalty. rlvr's own servers also start with ``--generation-config vllm``; the body covers a
``vllm.url`` server started without it. Source: vLLM ``CompletionRequest`` (the fields its
``_DEFAULT_SAMPLING_PARAMS`` take from the server's defaults; ``top_k=-1``: all tokens); issue 25
item 1 (NeMo-RL #3497, ART PR #140, prime-rl PR #886)."""


class VLLMEngine:
    """Generate with a vLLM server (started by rlvr or already running).

    Args:
        client: the server's :class:`VLLMClient`.
        eos_token_ids: ids that end a sequence (sent as ``stop_token_ids``).
        model_name: the served model name (``--served-model-name``).
        transport: how pushed weights reach the server (:class:`~rlvr.engines.weight_sync.FilesystemWeightSync`);
            ``None`` = no sync point (a frozen server, e.g. for evaluation).
        max_concurrency: most HTTP requests in flight at once.
        server: the :class:`~rlvr.engines.vllm_server.VLLMServer` this engine owns (closed by
            :meth:`close`), or None when connected to someone else's server.
        weights_dtype: dtype the pushed tensors are cast to (the server's dtype).
        seed_requests: send each request its own seed (:func:`request_seed`). Off by default in the
            config (``vllm.seed_requests``): vLLM 0.32's CPU worker fails with "CPU Generator does not
            use offset" when a seeded request's prefill is split across steps (chunked prefill).

    Attributes:
        eos_token_ids: ``set[int]``.
        generation_sync: the sync point (:class:`~rlvr.engines.weight_sync.ServerWeightSync`: ``version``,
            ``push``, ``pushes``), or None.
        stats: counters — ``requests``, ``generated_tokens``.
    """

    def __init__(
        self,
        client: VLLMClient,
        *,
        eos_token_ids: Sequence[int] | set[int],
        model_name: str = "rlvr-policy",
        transport: WeightTransport | None = None,
        max_concurrency: int = 256,
        server: Any = None,
        weights_dtype: torch.dtype | None = None,
        seed_requests: bool = True,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("VLLMEngine: eos_token_ids is empty (the tokenizer has no eos_token_id?)")
        if max_concurrency < 1:
            raise ValueError(f"VLLMEngine: max_concurrency must be >= 1, got {max_concurrency}")
        self.client = client
        self.eos_token_ids = {int(i) for i in eos_token_ids}
        self.model_name = model_name
        self.generation_sync = ServerWeightSync(transport, client) if transport is not None else None
        self.max_concurrency = int(max_concurrency)
        self.server = server
        self.weights_dtype = weights_dtype
        self.seed_requests = bool(seed_requests)
        self.on_close: list[Any] = []  # callables run by close() after the server stops (temp-dir cleanup)
        self.stats = {"requests": 0, "generated_tokens": 0}

    # ------------------------------------------------------------------------------------------
    def _body(self, req: GenerationRequest, index: int, params: SamplingParams) -> dict[str, Any]:
        greedy = params.temperature == 0
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": [int(t) for t in req.context_ids],
            "n": 1 if greedy else int(req.n),
            "max_tokens": int(req.max_new_tokens or params.max_new_tokens),
            "temperature": float(params.temperature),
            "logprobs": 0,
            "return_token_ids": True,
            "stop_token_ids": sorted(self.eos_token_ids),
            "skip_special_tokens": False,
        }
        body.update(NEUTRAL_SAMPLING)  # not the model's generation_config.json defaults (see NEUTRAL_SAMPLING)
        if not greedy:
            body["top_p"] = float(params.top_p)
            body["top_k"] = int(params.top_k) if params.top_k > 0 else -1
            if params.seed is not None and self.seed_requests:
                body["seed"] = request_seed(params.seed, index)
        return body

    def _parse(self, answer: Mapping[str, Any], req: GenerationRequest, index: int, greedy: bool) -> list[Generation]:
        choices = sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0))
        want = 1 if greedy else req.n
        if len(choices) != want:
            raise VLLMServerError(f"request {index}: the server returned {len(choices)} choices, expected {want}")
        out: list[Generation] = []
        for c in choices:
            ids = c.get("token_ids")
            lp = (c.get("logprobs") or {}).get("token_logprobs")
            if ids is None or lp is None:
                raise VLLMServerError(
                    f"request {index}: the server's answer has no token_ids/logprobs (needs vLLM >= 0.10 with "
                    "return_token_ids and logprobs support); got keys " + ", ".join(sorted(c))
                )
            if len(ids) != len(lp):
                raise VLLMServerError(f"request {index}: {len(ids)} token ids but {len(lp)} log-probs")
            reason = c.get("finish_reason")
            if reason == "stop":
                finish = "eos"
            elif reason == "length":
                finish = "length"
            else:
                raise VLLMServerError(f"request {index}: unexpected finish_reason {reason!r} (aborted?)")
            logprobs = [0.0] * len(ids) if greedy else [float(x) if x is not None else float("nan") for x in lp]
            out.append(Generation(token_ids=[int(t) for t in ids], logprobs=logprobs, finish_reason=finish))
        if greedy:  # the n continuations of a greedy request are identical (engine contract)
            g = out[0]
            out = [Generation(list(g.token_ids), list(g.logprobs), g.finish_reason) for _ in range(req.n)]
        return out

    def generate(self, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[list[Generation]]:
        """Continue each request's context ``request.n`` times (see :class:`~rlvr.engines.base.Engine`).

        Returns:
            ``out[i]``: ``requests[i].n`` generations — new token ids (EOS kept when sampled), their
            behaviour log-probs and finish reason.

        Raises:
            ValueError: an empty context, ``n < 1``, a request cap outside ``[1, params.max_new_tokens]``
                or invalid ``params``.
            VLLMServerError: the server failed a request (the message names the request index).
        """
        validate_sampling(params)
        validate_requests(requests, params)
        if not requests:
            return []
        greedy = params.temperature == 0
        bodies = [self._body(r, i, params) for i, r in enumerate(requests)]

        def one(i: int) -> list[Generation]:
            try:
                answer = self.client.completions(bodies[i])
            except VLLMServerError as e:
                raise VLLMServerError(f"request {i}: {e}") from None
            return self._parse(answer, requests[i], i, greedy)

        workers = min(self.max_concurrency, len(requests))
        if workers == 1:
            results = [one(0)]
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rlvr-vllm") as pool:
                results = list(pool.map(one, range(len(requests))))
        self.stats["requests"] += len(requests)
        self.stats["generated_tokens"] += sum(len(g.token_ids) for gens in results for g in gens)
        return results

    # ------------------------------------------------------------------------------------------
    def load_weights(self, state_dict: Mapping[str, torch.Tensor] | Any) -> None:
        """Protocol method: push ``state_dict`` (or a module's) now, whatever the version.

        Raises:
            ValueError: the engine has no sync point (``vllm.weight_sync=none``).
            VLLMServerError: the push failed.
        """
        if self.generation_sync is None:
            raise ValueError("VLLMEngine.load_weights: this engine has no weight sync (vllm.weight_sync=none)")
        sd = state_dict.state_dict() if isinstance(state_dict, torch.nn.Module) else state_dict
        self.generation_sync.push(sd.items(), self.generation_sync.version)

    def close(self) -> None:
        """Stop the server if this engine owns it (idempotent)."""
        if self.server is not None:
            self.server.close()
        while self.on_close:
            self.on_close.pop()()

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

