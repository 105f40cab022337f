"""``type: reward_model``: a sequence-classification model's score of (prompt, completion) as a reward.

The model is any ``transformers`` ``AutoModelForSequenceClassification`` (Skywork-Reward and ArmoRM style:
one scalar per conversation; ArmoRM's custom head gives a ``score`` output and needs
``trust_remote_code``). The conversation is rendered with the reward model's own chat template when its
tokenizer has one (the policy's template may differ), else as plain ``prompt\\ncompletion`` text.

Scoring runs under ``torch.no_grad`` in batches of ``batch_size`` rows, sorted by length so that a batch
carries little padding (the scores come back in the input order). Interpretation of TRL's and
OpenRLHF's reward-model scoring (the head's value at the last non-pad token of the whole
conversation; code-precedent), with the model on the trainer's device or its own.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

import torch

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


class RewardModelReward:
    """Scores completions with a sequence-classification model.

    Args:
        model: an ``AutoModelForSequenceClassification``-like module; its output's ``score`` (``[B]`` or
            ``[B, 1]``) when it has one, else ``logits[:, label_index]``.
        tokenizer: the reward model's tokenizer.
        name: the component's name (metric keys ``<name>/...``).
        batch_size: rows per forward.
        max_length: tokens per conversation; longer ones keep their last ``max_length`` tokens (the
            completion's end, where the score is read).
        label_index: the logit read when the head has several and there is no ``score``.
        system_prompt: the run's system prompt (a mixture problem's own wins, as for the policy).

    The model is moved to nothing here: build it on its device (:meth:`from_config` does).
    """

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "reward_model", batch_size: int = 8,
                 max_length: int = 1024, label_index: int = 0, system_prompt: str | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.label_index = int(label_index)
        self.system_prompt = system_prompt
        if getattr(tokenizer, "pad_token_id", None) is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:  # else a batch of several rows is refused
            model.config.pad_token_id = tokenizer.pad_token_id
        self._lock = threading.Lock()
        self._calls = 0
        self._seconds = 0.0

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
                   max_length=entry.max_length, label_index=entry.label_index, system_prompt=system_prompt)

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
        """Scores ``[N]`` (float32, CPU) of ``completions[i]`` as the answer to ``problems[i]``.

        Raises:
            ValueError: ``problems`` and ``completions`` differ in length.
        """
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems for {len(completions)} completions")
        t0 = time.perf_counter()
        texts = [self.render(p, c) for p, c in zip(problems, completions)]
        enc = [self.tokenizer(t, add_special_tokens=False)["input_ids"][-self.max_length:] for t in texts]
        order = sorted(range(len(enc)), key=lambda i: len(enc[i]))
        out = torch.empty(len(enc), dtype=torch.float32)
        pad = int(self.tokenizer.pad_token_id)
        with torch.no_grad():
            for s in range(0, len(order), self.batch_size):
                rows = order[s:s + self.batch_size]
                width = max(len(enc[i]) for i in rows)
                ids = torch.full((len(rows), width), pad, dtype=torch.long)
                mask = torch.zeros((len(rows), width), dtype=torch.long)
                for k, i in enumerate(rows):  # right padding: the head reads the last non-pad token
                    ids[k, :len(enc[i])] = torch.tensor(enc[i])
                    mask[k, :len(enc[i])] = 1
                res = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
                out[rows] = self._scalar(res).float().cpu()
        with self._lock:
            self._calls += len(texts)
            self._seconds += time.perf_counter() - t0
        return out

    def _scalar(self, res: Any) -> torch.Tensor:
        score = getattr(res, "score", None)
        if score is None:
            score = res.logits[:, self.label_index]
        return score.reshape(score.shape[0], -1)[:, 0]

    def pop_metrics(self) -> dict[str, float]:
        """``<name>/calls`` (completions scored) and ``<name>/seconds`` since the last call."""
        with self._lock:
            m = {f"{self.name}/calls": float(self._calls), f"{self.name}/seconds": self._seconds}
            self._calls, self._seconds = 0, 0.0
        return m

    def close(self) -> None:
        """Nothing to release (the model is freed with this object)."""


__all__ = ["RewardModelReward", "resolve_device", "resolve_dtype"]
