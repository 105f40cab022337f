"""``type: reward_model``: a sequence-classification model's score of (prompt, completion) as a reward.

The model is any ``transformers`` ``AutoModelForSequenceClassification`` (Skywork-Reward and ArmoRM style:
one scalar per conversation; ArmoRM's custom head gives a ``score`` output and needs
``trust_remote_code``). The conversation is rendered with the reward model's own chat template when its
tokenizer has one (the policy's template may differ), else as plain ``prompt\\ncompletion`` text.

Scoring runs under ``torch.no_grad`` in mini-batches of ``batch_size`` rows, sorted by length so that a
mini-batch carries little padding (the scores come back in the input order). Interpretation of TRL's and
OpenRLHF's reward-model scoring (the head's value at the last non-pad token of the whole
conversation; code-precedent), with the model on the trainer's device or its own.

Failure policy (the judge's, :mod:`rlvr.rewards.judge`): a batch has a deadline, ``batch_timeout_s``
from the start of :meth:`RewardModelReward.score`, checked before each mini-batch; the rows of the
mini-batches not started by then score ``failure_score`` and count in ``<name>/timeouts`` and
``<name>/failures``. A mini-batch whose forward raises (a device OOM, an input the model refuses) or
gives a non-finite score scores ``failure_score`` on its rows only and counts in ``<name>/failures``.
Neither stops the step. Conversations longer than ``max_length`` tokens keep their last ``max_length``,
and ``max_length`` is capped at the model's own limit (:func:`model_token_limit`), so a long input is
truncated rather than indexed past the model's position table.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from typing import Any, Sequence

import torch

from rlvr.config.rewards import DEFAULT_BATCH_TIMEOUT_S
from rlvr.errors import ModelLoadError
from rlvr.tasks.base import Problem
from rlvr.tasks.prompts import build_messages

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(spec: str, trainer_device: torch.device | str | None) -> torch.device:
    """``device`` of a ``rewards:`` entry: ``trainer`` → ``trainer_device`` (CPU when None), else as given."""
    if spec == "trainer":
        return torch.device(trainer_device if trainer_device is not None else "cpu")
    return torch.device(spec)


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """``dtype``: ``auto`` is bf16 on CUDA and fp32 elsewhere (CPU bf16 is slow without AMX)."""
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[spec]


def model_token_limit(model: Any, tokenizer: Any) -> int | None:
    """The most tokens one conversation may have for ``model``: the smaller of its config's
    ``max_position_embeddings`` (GPT-2's ``n_positions`` through its alias) and the tokenizer's
    ``model_max_length`` (which knows e.g. RoBERTa's 2-slot position offset: 514 positions, 512 tokens);
    a tokenizer's "unset" sentinel (≥ 10^9) is ignored. None when neither is known (a custom head)."""
    limits = []
    pos = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(pos, int) and not isinstance(pos, bool) and pos > 0:
        limits.append(pos)
    tml = getattr(tokenizer, "model_max_length", None)
    if isinstance(tml, int) and not isinstance(tml, bool) and 0 < tml < 10**9:
        limits.append(tml)
    return min(limits) if limits else None


class RewardModelReward:
    """Scores completions with a sequence-classification model.

    Args:
        model: an ``AutoModelForSequenceClassification``-like module; its output's ``score`` (``[B]`` or
            ``[B, 1]``) when it has one, else ``logits[:, label_index]``.
        tokenizer: the reward model's tokenizer.
        name: the component's name (metric keys ``<name>/...``).
        batch_size: rows per forward (a mini-batch); the deadline is checked between them.
        max_length: tokens per conversation; longer ones keep their last ``max_length`` tokens (the
            completion's end, where the score is read). Capped, with a warning, at the model's own limit
            (:func:`model_token_limit`): a learned-position model (GPT-2, RoBERTa) would otherwise fail
            on every long input.
        label_index: the logit read when the head has several and there is no ``score``.
        system_prompt: the run's system prompt (a mixture problem's own wins, as for the policy).
        failure_score: the raw score of a row not scored (deadline passed, forward raised, non-finite
            score): a number, or ``"batch_min"`` (the default): the lowest score of the rows this call did
            score (0.0 when it scored none). Why that default: a reward model's scale is its own (many give
            mostly negative scores), so any fixed value can pay a policy for making the scorer fail, e.g.
            by answers long enough to be cut by the deadline, and a failed row must never outscore a scored
            one (interpretation: the reward-hacking rule; the judge's fixed 0.0 is the bottom of its [0, 1]
            scale, so it has the same property). It enters ``normalize`` like any score.
        batch_timeout_s: the total seconds one :meth:`score` call may take (rendering, tokenising and
            every forward), checked before each mini-batch: the rows of the mini-batches not started by
            then score ``failure_score`` and count in ``<name>/timeouts``. A forward cannot be stopped from
            outside (it holds the device and the GIL), so a step is held at most ``batch_timeout_s`` plus
            one mini-batch's forward. None: no bound. Default 300 s, the judge's: one bound for a step's
            learned scoring whichever type scores it, and far above a normal batch (interpretation, an
            estimate not a measurement: an 8B model's forward costs ~2 · 8e9 FLOP per token, so a
            mini-batch of 8 × 1024 tokens is ~1.3e14 FLOP, well under a second on a current GPU at bf16,
            and a step of a few hundred completions scores in seconds), so only a pathological case (an
            OOM-thrashing or CPU-offloaded model, an enormous batch) is cut.

    Metrics (:meth:`pop_metrics`): ``<name>/calls`` (rows asked), ``<name>/seconds`` (wall time of
    :meth:`score`), ``<name>/failures`` (rows that scored ``failure_score``, timeouts included) and
    ``<name>/timeouts`` (those cut by the deadline), the judge's names.

    The model is moved to nothing here: build it on its device (:meth:`from_config` does).

    Raises:
        ValueError: ``batch_size`` < 1, ``batch_timeout_s`` not > 0, a non-finite ``failure_score``, or
            ``label_index`` ≥ the head's ``num_labels``.
    """

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "reward_model", batch_size: int = 8,
                 max_length: int = 1024, label_index: int = 0, system_prompt: str | None = None,
                 failure_score: float | str = "batch_min",
                 batch_timeout_s: float | None = DEFAULT_BATCH_TIMEOUT_S) -> None:
        if int(batch_size) < 1:
            raise ValueError(f"{name}: batch_size must be >= 1, got {batch_size!r}")
        if batch_timeout_s is not None and not batch_timeout_s > 0:
            raise ValueError(f"{name}: batch_timeout_s must be > 0 seconds or None, got {batch_timeout_s!r}")
        if failure_score != "batch_min" and (isinstance(failure_score, str)
                                             or not math.isfinite(failure_score)):
            raise ValueError(f"{name}: failure_score must be a finite number or 'batch_min', got "
                             f"{failure_score!r}")
        num_labels = getattr(getattr(model, "config", None), "num_labels", None)
        if isinstance(num_labels, int) and label_index >= num_labels:
            raise ValueError(f"{name}: label_index={label_index} but the model's head has {num_labels} "
                             f"label(s) (0..{num_labels - 1})")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        limit = model_token_limit(model, tokenizer)
        if limit is not None and self.max_length > limit:
            warnings.warn(f"{name}: max_length={self.max_length} is more than the reward model takes "
                          f"({limit} tokens); longer conversations keep their last {limit} tokens",
                          stacklevel=2)
            self.max_length = limit
        self.label_index = int(label_index)
        self.system_prompt = system_prompt
        self.failure_score: float | str = failure_score if failure_score == "batch_min" else float(failure_score)
        self.batch_timeout_s = batch_timeout_s
        if getattr(tokenizer, "pad_token_id", None) is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:  # else a batch of several rows is refused
            model.config.pad_token_id = tokenizer.pad_token_id
        self._lock = threading.Lock()
        self._counts = {"calls": 0, "failures": 0, "timeouts": 0}
        self._seconds = 0.0
        self._warned = False

    @classmethod
    def from_config(cls, entry: Any, *, trainer_device: Any = None, system_prompt: str | None = None,
                    name: str | None = None) -> "RewardModelReward":
        """Load ``entry.name_or_path`` (``tiny``: :func:`rlvr.models.tiny.build_tiny_reward_model`) on the
        entry's device and dtype.

        Raises:
            ModelLoadError: the model or tokenizer cannot be loaded (the message names the key).
        """
        device = resolve_device(entry.device, trainer_device)
        dtype = resolve_dtype(entry.dtype, device)
        path = entry.name_or_path
        if path == "tiny" or path.startswith("tiny:"):
            from rlvr.models.tiny import build_tiny_reward_model

            model, tok = build_tiny_reward_model(int(path.partition(":")[2] or 0))
        else:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            kw = {"revision": entry.revision, "trust_remote_code": entry.trust_remote_code}
            try:
                tok = AutoTokenizer.from_pretrained(path, **kw)
                model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype, **kw)
            except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, ...
                raise ModelLoadError(f"rewards: reward_model name_or_path={path!r} could not be loaded "
                                     f"({type(exc).__name__}: {exc})") from None
        model = model.to(device=device, dtype=dtype)
        return cls(model, tok, name=name or entry.default_name, batch_size=entry.batch_size,
                   max_length=entry.max_length, label_index=entry.label_index, system_prompt=system_prompt,
                   failure_score=entry.resolved_failure_score, batch_timeout_s=entry.batch_timeout_s)

    @property
    def device(self) -> torch.device:
        """Where the model's weights are."""
        return next(self.model.parameters()).device

    def render(self, problem: Problem, completion: str) -> str:
        """The conversation text the model scores: its chat template over the prompt's messages and the
        completion as the assistant turn, or ``"<user turn>\\n<completion>"`` without a template."""
        messages = build_messages(problem, self.system_prompt)
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                [*messages, {"role": "assistant", "content": completion}], tokenize=False)
        return f"{messages[-1]['content']}\n{completion}"

    def score(self, problems: Sequence[Problem], completions: Sequence[str]) -> torch.Tensor:
        """Scores ``[N]`` (float32, CPU) of ``completions[i]`` as the answer to ``problems[i]``;
        ``failure_score`` on the rows of a mini-batch that failed or was not started within
        ``batch_timeout_s`` of this call's start (see the class docstring).

        Raises:
            ValueError: ``problems`` and ``completions`` differ in length.
        """
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems for {len(completions)} completions")
        t0 = time.perf_counter()
        deadline = None if self.batch_timeout_s is None else time.monotonic() + self.batch_timeout_s
        texts = [self.render(p, c) for p, c in zip(problems, completions)]
        enc = [self.tokenizer(t, add_special_tokens=False)["input_ids"][-self.max_length:] for t in texts]
        order = sorted(range(len(enc)), key=lambda i: len(enc[i]))
        out = torch.zeros(len(enc), dtype=torch.float32)
        ok = torch.zeros(len(enc), dtype=torch.bool)  # rows this call scored
        failures = timeouts = 0
        for s in range(0, len(order), self.batch_size):
            rows = order[s:s + self.batch_size]
            if deadline is not None and time.monotonic() >= deadline:
                cut = len(order) - s  # this mini-batch and every later one
                failures += cut
                timeouts += cut
                self._warn_once(f"batch_timeout_s={self.batch_timeout_s:g} s passed with {cut} of "
                                f"{len(order)} rows not scored")
                break
            try:
                scores = self._forward([enc[i] for i in rows])
            except Exception as exc:  # noqa: BLE001 - an OOM, a refused input, a head's error
                self._release_cache()
                failures += len(rows)
                self._warn_once(f"a forward of {len(rows)} rows raised {type(exc).__name__}: "
                                f"{str(exc)[:200]}")
                continue
            bad = ~torch.isfinite(scores)
            if bool(bad.any()):
                failures += int(bad.sum())
                self._warn_once(f"{int(bad.sum())} non-finite scores (dtype overflow?)")
            out[rows] = scores
            ok[rows] = ~bad
        out[~ok] = self._failure_value(out[ok])
        with self._lock:
            self._counts["calls"] += len(texts)
            self._counts["failures"] += failures
            self._counts["timeouts"] += timeouts
            self._seconds += time.perf_counter() - t0
        return out

    def _failure_value(self, scored: torch.Tensor) -> float:
        """The score of a failed row, given the ``[k]`` scores of the rows this call scored."""
        if self.failure_score != "batch_min":
            return float(self.failure_score)
        return float(scored.min()) if scored.numel() else 0.0

    def _forward(self, seqs: list[list[int]]) -> torch.Tensor:
        """Scores ``[len(seqs)]`` (float32, CPU) of token-id lists, right-padded into one forward."""
        width = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), width), int(self.tokenizer.pad_token_id), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for k, x in enumerate(seqs):  # right padding: the head reads the last non-pad token
            ids[k, :len(x)] = torch.tensor(x, dtype=torch.long)
            mask[k, :len(x)] = 1
        with torch.no_grad():
            res = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
            return self._scalar(res).float().cpu()

    def _release_cache(self) -> None:
        """After a failed forward: hand the allocator's cached blocks back (an OOM's partial activations)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _warn_once(self, text: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"{self.name}: {text}; such rows score failure_score={self.failure_score} and "
                          f"the run continues (counted in {self.name}/failures and {self.name}/timeouts)",
                          stacklevel=3)

    def _scalar(self, res: Any) -> torch.Tensor:
        score = getattr(res, "score", None)
        if score is None:
            score = res.logits[:, self.label_index]
        return score.reshape(score.shape[0], -1)[:, 0]

    def pop_metrics(self) -> dict[str, float]:
        """``<name>/calls`` (rows asked), ``<name>/failures``, ``<name>/timeouts`` and ``<name>/seconds``
        since the last call (see the class docstring), then reset."""
        with self._lock:
            m = {f"{self.name}/{k}": float(v) for k, v in self._counts.items()}
            m[f"{self.name}/seconds"] = self._seconds
            self._counts = dict.fromkeys(self._counts, 0)
            self._seconds = 0.0
        return m

    def close(self) -> None:
        """Nothing to release (the model is freed with this object)."""


__all__ = ["RewardModelReward", "model_token_limit", "resolve_device", "resolve_dtype"]
