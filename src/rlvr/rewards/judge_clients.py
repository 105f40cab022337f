"""The two ways a judge is asked: an OpenAI-compatible server, or a Hugging Face causal LM in-process.

Each client answers ``complete_many(prompts, deadline=None) -> list[JudgeReply]``, one reply or error per
prompt in order, and never raises for a failed call: :class:`~rlvr.rewards.judge.JudgeReward` turns a
failure into ``failure_score`` and counts it. ``deadline`` (a ``time.monotonic()`` instant: the judge's
``batch_timeout_s`` from the start of the batch) bounds the whole call: a prompt not answered by then
comes back as a failed reply with ``timed_out=True`` (how each client keeps it: its class docstring).

* :class:`OpenAIJudgeClient`: ``POST {base_url}/chat/completions`` (``vllm serve``, SGLang, TGI, or any
  hosted OpenAI-compatible API) through the standard library's ``urllib`` (no extra dependency), greedy
  (``temperature: 0``), with a per-call socket timeout, retries with exponential backoff on what may pass
  (connection errors and resets, timeouts, HTTP 408/429/5xx, a malformed, truncated or undecodable body,
  any other exception while reading the answer) and none on what will not (other 4xx), and at most
  ``max_concurrency`` calls in flight (a thread pool). The API key is read from the
  environment variable the config names and goes only into the ``Authorization`` header: it is never
  put in a message, a metric or the config dump.
* :class:`HFJudgeClient`: ``model.generate`` (greedy) in batches, for offline runs and tests.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from rlvr.errors import ConfigError, ModelLoadError

MAX_BODY_BYTES = 4 * 2**20
"""A judge server's answer is read up to this size (a chat completion of a few hundred tokens is ~2 KiB)."""

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses worth another try (the server may answer next time); any other 4xx fails at once."""

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass(frozen=True)
class JudgeReply:
    """One judge call's outcome.

    Attributes:
        text: the judge's reply, or None when the call failed.
        error: why it failed (``"HTTP 503 from http://…"``, ``"timeout after 30 s"``), or None.
        seconds: the call's wall time, retries and their waits included.
        attempts: HTTP requests made (1 without retries; the HF client: 1).
        timed_out: the batch deadline passed before the call was answered (``text`` is None).
    """

    text: str | None
    error: str | None = None
    seconds: float = 0.0
    attempts: int = 1
    timed_out: bool = False


DEADLINE_ERROR = "the judge's batch deadline (batch_timeout_s) passed before an answer"
"""The error of a reply cut off by the batch deadline."""


class OpenAIJudgeClient:
    """A judge behind an OpenAI-compatible ``/v1/chat/completions`` endpoint.

    The batch deadline of :meth:`complete_many` is kept by the thread pool, not by the reward worker
    processes (:mod:`rlvr.rewards.pool`): a judge call is I/O-bound, threads wait on sockets without the
    GIL, and a process per call would add a fork and a pickled prompt for nothing. The caller waits on
    the calls' futures until the deadline and no longer (a call still in flight is abandoned, its row
    failed); each call also shortens its socket timeout and backoff waits to the time left and makes no
    retry past the deadline, so an abandoned call ends within about one socket read of it instead of
    piling up behind the next batch.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended).
        model: the served model's name (the request's ``model``; also the cache key's model).
        api_key: sent as ``Authorization: Bearer …`` when given (read it from the environment:
            :func:`build_client`).
        timeout_s: socket timeout of each HTTP request (connect and each read), seconds.
        max_retries: further tries after a retryable failure (0: one try).
        backoff_s: wait before the first retry; doubled before each next one (``backoff_s · 2^k``).
        max_concurrency: requests in flight at once (worker threads).
        max_tokens: the reply's token cap.
        sleep: the wait function (tests pass a recorder).
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 60.0,
                 max_retries: int = 2, backoff_s: float = 0.5, max_concurrency: int = 8, max_tokens: int = 256,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.model_id = model
        self._api_key = api_key
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_concurrency = int(max_concurrency)
        self.max_tokens = int(max_tokens)
        self._sleep = sleep
        host = urllib.parse.urlsplit(self.url).hostname or ""
        # a loopback server is reached directly, whatever http_proxy says
        handlers = [urllib.request.ProxyHandler({})] if host in _LOOPBACK else []
        self._opener = urllib.request.build_opener(*handlers)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __repr__(self) -> str:  # the key stays out of reprs and tracebacks' locals
        return f"OpenAIJudgeClient(url={self.url!r}, model={self.model!r})"

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def complete(self, prompt: str, deadline: float | None = None) -> JudgeReply:
        """One judgement with its retries: the reply's ``choices[0].message.content``, or the last error.
        Never raises: any exception of an attempt is that attempt's error (retried, as a malformed body).
        With ``deadline`` (``time.monotonic()``), no attempt or wait starts after it and each socket
        timeout is cut to the time left."""
        t0 = time.perf_counter()

        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": prompt}],
                           "temperature": 0.0, "max_tokens": self.max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        error = "no attempt"
        attempt = 0
        for attempt in range(self.max_retries + 1):
            if attempt:
                wait = self.backoff_s * 2 ** (attempt - 1)
                if deadline is not None and time.monotonic() + wait >= deadline:
                    return JudgeReply(None, self._redact(f"{error}; no retry: {DEADLINE_ERROR}"),
                                      time.perf_counter() - t0, attempt, timed_out=True)
                self._sleep(wait)
            timeout = self.timeout_s
            if deadline is not None:
                timeout = min(timeout, deadline - time.monotonic())
                if timeout <= 0:
                    return JudgeReply(None, DEADLINE_ERROR, time.perf_counter() - t0, attempt,
                                      timed_out=True)
            try:
                text, error, retry = self._attempt(body, headers, timeout)
            except Exception as exc:  # noqa: BLE001 - whatever a server's answer does, it fails this call only
                text, error, retry = None, f"{type(exc).__name__} from {self.url}: {str(exc)[:200]}", True
            if text is not None:
                return JudgeReply(text, None, time.perf_counter() - t0, attempt + 1)
            if not retry:
                break
        return JudgeReply(None, self._redact(error), time.perf_counter() - t0, attempt + 1)

    def _attempt(self, body: bytes, headers: dict[str, str], timeout: float) -> tuple[str | None, str, bool]:
        """``(reply, error, retryable)`` of one HTTP request (``timeout``: its socket timeout, seconds).
        May raise on an answer no branch foresaw: :meth:`complete` turns that into a failed attempt."""
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with self._opener.open(req, timeout=timeout) as resp:
                raw = resp.read(MAX_BODY_BYTES + 1)
        except urllib.error.HTTPError as exc:
            try:
                detail = exc.read(300).decode("utf-8", "replace").strip() if exc.fp is not None else ""
            except Exception:  # noqa: BLE001 - a reset or truncated error body: the status is enough
                detail = ""
            return None, f"HTTP {exc.code} from {self.url}" + (f": {detail[:200]}" if detail else ""), \
                exc.code in RETRY_STATUS
        except (TimeoutError, OSError, http.client.HTTPException) as exc:  # URLError is an OSError
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
                return None, f"timeout after {timeout:.3g} s from {self.url}", True
            return None, f"{type(exc).__name__} from {self.url}: {reason}", True
        if len(raw) > MAX_BODY_BYTES:
            return None, f"reply from {self.url} larger than {MAX_BODY_BYTES // 2**20} MiB", False
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError):  # UnicodeDecodeError: a ValueError
            return None, f"malformed reply from {self.url}: {raw[:120]!r}", True
        if not isinstance(content, str):
            return None, f"malformed reply from {self.url}: content is {type(content).__name__}", True
        return content, "", False

    def complete_many(self, prompts: Sequence[str], deadline: float | None = None) -> list[JudgeReply]:
        """:meth:`complete` of every prompt, at most ``max_concurrency`` at once; replies in order.

        With ``deadline`` (``time.monotonic()``) it returns by then: a prompt not answered (still queued
        or in flight) gets a failed reply with ``timed_out=True``; the queued ones are cancelled."""
        if not prompts:
            return []
        if deadline is None and (len(prompts) == 1 or self.max_concurrency == 1):
            return [self.complete(p) for p in prompts]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="rlvr-judge")
            pool = self._pool
        m0 = time.monotonic()
        futures = [pool.submit(self.complete, p, deadline) for p in prompts]
        wait(futures, timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        out = []
        for f in futures:
            if f.done() and not f.cancelled():
                out.append(f.result())  # complete() never raises
            else:
                f.cancel()
                out.append(JudgeReply(None, DEADLINE_ERROR, time.monotonic() - m0, 0,
                                      timed_out=True))
        return out

    def close(self) -> None:
        """Stop the worker threads (started again on the next :meth:`complete_many`); queued calls are
        cancelled, a call in flight ends within its socket timeout."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None


class HFJudgeClient:
    """A judge that is a causal LM in this process: greedy ``generate`` over the chat-rendered prompts.

    The batch deadline of :meth:`complete_many` is kept inside ``generate``, by a stopping criterion
    that ends the generation at the first decoding step past the deadline (that batch's rows fail with
    ``timed_out``; later batches are not started). Not a thread or a worker process: a thread cannot stop
    a running ``generate`` (it would run on, holding the GIL and the device, into the next step), and a
    worker process would need its own copy of the judge's weights (on a GPU, a second CUDA context).
    The bound is one decoding step of one batch past the deadline (the prompt's prefill included).

    Args:
        model: a ``transformers`` causal LM (on its device; not trained).
        tokenizer: its tokenizer (its chat template renders the prompt when it has one).
        max_new_tokens: the reply's token cap.
        batch_size: prompts per ``generate`` call.
        model_id: the cache key's model (the ``name_or_path``).

    A prompt longer than the model's positions leave room for is not truncated (the rubric or the answer
    would be lost): it fails, as an unreachable server would.
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_new_tokens: int = 256, batch_size: int = 8,
                 model_id: str = "hf") -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = int(batch_size)
        self.model_id = model_id
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 0)

    def _ids(self, prompt: str) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
            return tok(text, add_special_tokens=False)["input_ids"]
        return tok(prompt)["input_ids"]

    def complete_many(self, prompts: Sequence[str], deadline: float | None = None) -> list[JudgeReply]:
        """Greedy replies, ``batch_size`` prompts per ``generate``; a batch that raises fails its rows.
        With ``deadline`` (``time.monotonic()``): the rows of a batch cut off by it, and of the batches
        not started, fail with ``timed_out=True``."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        class _Deadline(StoppingCriteria):
            hit = False

            def __call__(self, input_ids, scores, **kwargs):  # noqa: ANN001 - transformers' signature
                self.hit = self.hit or time.monotonic() >= deadline
                return torch.full((input_ids.shape[0],), self.hit, dtype=torch.bool, device=input_ids.device)

        out: list[JudgeReply] = []
        device = next(self.model.parameters()).device
        pad = int(self.tokenizer.pad_token_id)
        for s in range(0, len(prompts), self.batch_size):
            n_batch = len(prompts[s:s + self.batch_size])
            if deadline is not None and time.monotonic() >= deadline:
                out.extend(JudgeReply(None, DEADLINE_ERROR, 0.0, 0, timed_out=True) for _ in range(n_batch))
                continue
            stop = _Deadline() if deadline is not None else None
            t0 = time.perf_counter()
            ids = [self._ids(p) for p in prompts[s:s + self.batch_size]]
            limit = self.max_positions - self.max_new_tokens if self.max_positions else None
            long = [i for i, x in enumerate(ids) if limit is not None and len(x) > limit]
            keep = [i for i in range(len(ids)) if i not in long]
            texts: dict[int, str] = {}
            error = None
            if keep:
                width = max(len(ids[i]) for i in keep)
                inp = torch.full((len(keep), width), pad, dtype=torch.long)
                mask = torch.zeros_like(inp)
                for k, i in enumerate(keep):  # left padding: every row's reply starts at column `width`
                    inp[k, width - len(ids[i]):] = torch.tensor(ids[i])
                    mask[k, width - len(ids[i]):] = 1
                try:
                    with torch.no_grad():
                        gen = self.model.generate(input_ids=inp.to(device), attention_mask=mask.to(device),
                                                  do_sample=False, max_new_tokens=self.max_new_tokens,
                                                  pad_token_id=pad, stopping_criteria=StoppingCriteriaList(
                                                      [stop] if stop is not None else []))
                    for k, i in enumerate(keep):
                        texts[i] = self.tokenizer.decode(gen[k, width:].tolist(), skip_special_tokens=True)
                except Exception as exc:  # noqa: BLE001 - a failed generate fails its rows, not the run
                    error = f"{type(exc).__name__}: {exc}"
            per = (time.perf_counter() - t0) / len(ids)
            for i in range(len(ids)):
                if stop is not None and stop.hit and i in keep:
                    out.append(JudgeReply(None, DEADLINE_ERROR, per, timed_out=True))
                elif i in texts:
                    out.append(JudgeReply(texts[i], None, per))
                elif i in long:
                    out.append(JudgeReply(None, f"judge prompt of {len(ids[i])} tokens + max_new_tokens="
                                          f"{self.max_new_tokens} exceeds the judge's {self.max_positions} "
                                          "positions", per))
                else:
                    out.append(JudgeReply(None, error, per))
        return out


def api_key_from_env(var: str | None, where: str = "rewards: judge") -> str | None:
    """The API key held by environment variable ``var`` (None: no key).

    Raises:
        ConfigError: ``var`` is set in the config but not in the environment (named; the value never is).
    """
    if not var:
        return None
    key = os.environ.get(var)
    if not key:
        raise ConfigError(f"{where} api_key_env={var!r}: the environment variable {var} is not set (export "
                          "it with the judge server's API key, or drop api_key_env for a server without one)")
    return key


def build_client(entry: Any, *, trainer_device: Any = None) -> OpenAIJudgeClient | HFJudgeClient:
    """The client of a ``type: judge`` entry (:class:`rlvr.config.rewards.RewardConfig`).

    Raises:
        ConfigError: ``api_key_env`` names an unset variable. ModelLoadError: the hf model cannot load.
    """
    if entry.client == "openai":
        return OpenAIJudgeClient(entry.base_url, entry.model, api_key=api_key_from_env(entry.api_key_env),
                                 timeout_s=entry.timeout_s, max_retries=entry.max_retries, backoff_s=entry.backoff_s,
                                 max_concurrency=entry.max_concurrency, max_tokens=entry.max_new_tokens)
    from rlvr.rewards.reward_model import resolve_device, resolve_dtype

    device = resolve_device(entry.device, trainer_device)
    dtype = resolve_dtype(entry.dtype, device)
    path = entry.name_or_path
    if path == "tiny" or path.startswith("tiny:"):
        from rlvr.models.tiny import build_tiny_model

        model, tok = build_tiny_model(int(path.partition(":")[2] or 0))
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        kw = {"revision": entry.revision, "trust_remote_code": entry.trust_remote_code}
        try:
            tok = AutoTokenizer.from_pretrained(path, **kw)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
        except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, ...
            raise ModelLoadError(f"rewards: judge name_or_path={path!r} could not be loaded "
                                 f"({type(exc).__name__}: {exc})") from None
    model = model.to(device=device, dtype=dtype).requires_grad_(False)
    return HFJudgeClient(model, tok, max_new_tokens=entry.max_new_tokens, batch_size=entry.batch_size,
                         model_id=path)


__all__ = ["DEADLINE_ERROR", "HFJudgeClient", "JudgeReply", "OpenAIJudgeClient", "RETRY_STATUS", "api_key_from_env", "build_client"]
