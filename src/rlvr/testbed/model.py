"""The testbed policy: a character-level tokenizer and a small llama, pre-trained in-process.

``ensure_testbed_model("testbed:small")`` returns a Hugging Face folder (safetensors + tokenizer +
chat template) under ``~/.cache/rlvr/testbed/``, pre-training it first if it is not cached.
``rlvr.models.load_policy`` routes ``model.name_or_path=testbed[:preset[:seed]]`` here, so the
trainer, engine and evaluator see an ordinary ``LlamaForCausalLM``.

Pre-training is next-token prediction on the answer (and EOS) of synthetic
:mod:`rlvr.testbed.task` examples at levels ``1..max_level``, with per-letter label noise: each
answer letter is replaced by a random letter with probability ``noise``. The noise leaves the
policy a spread-out sampling distribution (room for RL to sharpen it, and entropy to collapse);
levels above ``max_level`` are never seen, so their pass rate is ~0 (zero-pass groups).

Source: interpretation of issue 8 ("a tiny transformer (a few million parameters) that rlvr
pre-trains in-process for about a minute on a synthetic task family with controllable
difficulty, cached after the first build").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlvr.util.staging import publish_folder, remove_stale
from rlvr.testbed.mixture import V2_CHARS, v2_example
from rlvr.testbed.task import ALPHABET, OPS, make_example

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHARS = ALPHABET + "".join(OPS) + ":= "
CHAT_TEMPLATE = (
    "{{ '<|im_start|>' }}"
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ message['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '=' }}{% endif %}"
)
"""Renders only the user turn (``<|im_start|>R:abc``) then ``=``: the system turn is dropped, which
keeps character-level prompts short (interpretation: the testbed task's answer format needs no
instruction; its ``system_prompt`` is empty)."""
CACHE_ROOT = Path("~/.cache/rlvr/testbed")


@dataclass(frozen=True)
class TestbedSpec:
    """Architecture and pre-training recipe of a testbed model.

    Attributes:
        hidden_size, num_layers, num_heads, intermediate_size: ``LlamaConfig`` sizes.
        steps: pre-training optimizer steps; batch_size: sequences per step.
        learning_rate: AdamW peak rate (linear warm-up over 5 % of steps, cosine decay to 10 %).
        max_level: longest string seen in pre-training (levels 1..max_level uniformly).
        ops: op codes of the pre-training mixture.
        noise: per-letter probability of replacing an answer letter by a random letter.
        seed: seed of the weight init and of the data stream.
        chain_steps, hard_max_level, hard_noise, feedback_frac, attempt_noise, feedback_noise:
            testbed v2 (issue 17 §2; :mod:`rlvr.testbed.mixture`): chains of up to ``chain_steps``
            ops, levels ``max_level+1..hard_max_level`` with noise ``hard_noise``, and a fraction
            ``feedback_frac`` of correction sequences (attempts with letter noise ``attempt_noise``,
            corrected answers with ``feedback_noise``). At their defaults the spec is v1: same
            data stream, same tokenizer, same cache key.
        tool_frac: the tools testbed (issue 26 item 7; :mod:`rlvr.testbed.tools`): the share of
            hard-level sequences that are whole ``transform`` tool episodes (0 = off).
    """

    hidden_size: int = 96
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 256
    steps: int = 500
    batch_size: int = 64
    learning_rate: float = 3e-3
    max_level: int = 8
    ops: str = "RC"
    noise: float = 0.08
    seed: int = 0
    chain_steps: int = 1
    hard_max_level: int = 0
    hard_noise: float = 0.0
    feedback_frac: float = 0.0
    attempt_noise: float = 0.3
    feedback_noise: float = 0.0
    tool_frac: float = 0.0

    __test__ = False

    @property
    def is_v2(self) -> bool:
        """True when any v2 feature is on (v2 data mixture and vocabulary)."""
        return self.chain_steps > 1 or self.hard_max_level > self.max_level or self.feedback_frac > 0

    @property
    def has_tools(self) -> bool:
        """True for a tools-testbed spec (tool-episode mixture, tools vocabulary and chat template)."""
        return self.tool_frac > 0

    def key(self) -> str:
        """Short stable hash of every field (the cache folder name depends on it). v2 fields at
        their defaults are left out, so a v1 spec keeps the hash (and cache folder) it had before v2."""
        d = dataclasses.asdict(self)
        for f in _V2_FIELDS:
            if d[f.name] == f.default:
                del d[f.name]
        blob = json.dumps(d, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]


_V2_FIELDS = [f for f in dataclasses.fields(TestbedSpec) if f.name in
              ("chain_steps", "hard_max_level", "hard_noise", "feedback_frac", "attempt_noise", "feedback_noise",
               "tool_frac")]


PRESETS: dict[str, TestbedSpec] = {
    "small": TestbedSpec(),
    "micro": TestbedSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, steps=30, batch_size=16,
                         max_level=4),
    "v2": TestbedSpec(steps=1000, max_level=6, hard_max_level=8, hard_noise=0.45, chain_steps=2, feedback_frac=0.25,
                      feedback_noise=0.1),
    "v2l": TestbedSpec(steps=2400, max_level=6, hard_max_level=8, hard_noise=0.45, chain_steps=2, feedback_frac=0.25,
                       feedback_noise=0.1),
    "tools": TestbedSpec(steps=2000, max_level=4, hard_max_level=7, hard_noise=0.7, tool_frac=0.3),
    "microtools": TestbedSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, steps=30, batch_size=16,
                              max_level=4, hard_max_level=6, hard_noise=0.5, tool_frac=0.25),
    "micro2": TestbedSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, steps=30, batch_size=16,
                          max_level=4, hard_max_level=5, hard_noise=0.45, chain_steps=2, feedback_frac=0.3,
                          feedback_noise=0.1),
}
"""Named specs: ``small`` (v1, 0.33 M parameters, ~100 s of pre-training on 2 cores), ``micro`` (tests),
``v2`` (testbed v2, issue 17 §2: chains, hard levels 7–8, corrections; ``docs/testbed.md``), ``v2l``
(the same mixture and architecture pre-trained 2.4× longer, 2400 steps: v2 ended at 0.80 nats/token and
GRPO barely moved it; ~12 min of pre-training on the shared machine, so build it in chunks with
``python -m rlvr.testbed.build testbed:v2l --max-seconds 480``), ``micro2`` (v2 features at test size), ``tools``
(issue 26 item 7, :mod:`rlvr.testbed.tools`: levels 1–4 answered directly, levels 5–7 with the ``transform`` tool
on 30 % of pre-training sequences and directly with letter noise 0.7 otherwise; 2000 steps, ~3 min on 2 cores: at
600 steps on levels 7–10 the policy copied the call's query and the tool's reply inexactly and no tool episode
was correct) and ``microtools`` (the same kind of mixture at test size)."""


def parse_spec(name: str) -> tuple[str, TestbedSpec]:
    """``"testbed"`` / ``"testbed:<preset>"`` / ``"testbed:<preset>:<seed>"`` → ``(preset, spec)``.

    Raises:
        ValueError: not a testbed name, unknown preset, or a non-integer seed.
    """
    parts = name.split(":")
    if parts[0] != "testbed" or len(parts) > 3:
        raise ValueError(f"not a testbed model name: {name!r} (use testbed, testbed:<preset> or testbed:<preset>:<seed>)")
    preset = parts[1] if len(parts) > 1 and parts[1] else "small"
    if preset not in PRESETS:
        raise ValueError(f"unknown testbed preset {preset!r}; known: {', '.join(PRESETS)}")
    spec = PRESETS[preset]
    if len(parts) == 3:
        try:
            spec = dataclasses.replace(spec, seed=int(parts[2]))
        except ValueError:
            raise ValueError(f"testbed seed must be an integer, got {parts[2]!r} in {name!r}") from None
    return preset, spec


def build_tokenizer(v2: bool = False, tools: bool = False) -> Any:
    """Character-level ``PreTrainedTokenizerFast``: one token per character of :data:`CHARS` (and,
    with ``v2``, of :data:`rlvr.testbed.mixture.V2_CHARS` after them: digits, ``!``, ``|``), plus
    ``<|endoftext|>`` (0, unk), ``<|im_start|>`` (1, bos), ``<|im_end|>`` (2, eos and pad); decoding
    joins characters without spaces. ``tools`` (implies ``v2``): also ``>`` and the two call tokens of
    :mod:`rlvr.testbed.tools`, with its chat template. Deterministic; no file, no training."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    import rlvr.testbed.tools as tt

    v2 = v2 or tools
    extra = (list(V2_CHARS) if v2 else []) + (list(tt.TOOL_CHARS) if tools else [])
    vocab = {t: i for i, t in enumerate(list(SPECIALS) + list(CHARS) + extra)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|endoftext|>"))
    tk.add_special_tokens(list(SPECIALS))
    if tools:
        from tokenizers import AddedToken

        tk.add_tokens([AddedToken(t, normalized=False) for t in (tt.CALL_OPEN, tt.CALL_CLOSE)])
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tok.chat_template = tt.CHAT_TEMPLATE if tools else CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def build_model(spec: TestbedSpec, tok: Any) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` of ``spec``'s size (init seeded by ``spec.seed``;
    the global RNG state is restored afterwards)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_heads,
        max_position_embeddings=128, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    state = torch.get_rng_state()
    try:
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
    finally:
        torch.set_rng_state(state)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    return model


def _batch(rng: random.Random, spec: TestbedSpec, tok: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [B, L], labels [B, L])``: labels are -100 except on the answer letters and EOS."""
    rows, labels = [], []
    if spec.has_tools:
        return _pad_rows([_tool_row(rng, spec, tok) for _ in range(spec.batch_size)], tok.pad_token_id)
    for _ in range(spec.batch_size):
        if spec.is_v2:
            p, a = v2_example(rng, spec)
        else:
            q, a = make_example(rng, rng.randint(1, spec.max_level), spec.ops)
            a = "".join(rng.choice(ALPHABET) if rng.random() < spec.noise else c for c in a)
            p = f"{q}="
        prompt = tok(f"<|im_start|>{p}", add_special_tokens=False)["input_ids"]
        ans = tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append(prompt + ans)
        labels.append([-100] * len(prompt) + ans)
    return _pad_rows(list(zip(rows, labels)), tok.pad_token_id)


def _tool_row(rng: random.Random, spec: TestbedSpec, tok: Any) -> tuple[list[int], list[int]]:
    """``(ids, labels)`` of one tools-testbed sequence (:func:`rlvr.testbed.tools.tool_example`)."""
    from rlvr.testbed.tools import tool_example

    ids, lab = [tok.bos_token_id], [-100]
    for text, trained in tool_example(rng, spec):
        part = tok(text, add_special_tokens=False)["input_ids"]
        ids += part
        lab += part if trained else [-100] * len(part)
    return ids, lab


def _pad_rows(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad ``(ids, labels)`` rows to ``(input_ids [B, L], labels [B, L])`` (labels padded with -100)."""
    rows, labels = [r for r, _ in pairs], [l for _, l in pairs]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (r, l) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(l)] = torch.tensor(l)
    return ids, lab


def _v2_loss(model: Any, ids: torch.Tensor, lab: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Token-mean next-token loss of a v2 batch, computed (and back-propagated) in two halves of
    rows sorted by length, each cut to its own width: v2 rows range from ~5 to ~60 tokens, and one
    padded forward would spend most of its time on padding. Equal to the one-pass token mean
    (each half is weighted by its share of label tokens). Returns the loss (already backward-ed)."""
    lengths = (lab != -100).int().cumsum(1).argmax(1) + 1  # end of each row's labels
    order = torch.argsort(lengths)
    halves = [order[: len(order) // 2], order[len(order) // 2:]]
    total = int((lab[:, 1:] != -100).sum())
    acc = torch.zeros(())
    for rows in halves:
        if len(rows) == 0:
            continue
        w = int(lengths[rows].max())
        i, l = ids[rows, :w], lab[rows, :w]
        n = int((l[:, 1:] != -100).sum())
        out = model(input_ids=i, attention_mask=torch.ones_like(i), labels=l)
        part = out.loss * (n / total)
        part.backward()
        acc = acc + part.detach()
    return acc


class PretrainPaused(RuntimeError):
    """Raised by :func:`pretrain` when ``max_seconds`` ran out first; the checkpoint holds the
    progress (``.step``) and the next call with the same ``checkpoint_dir`` resumes from it."""

    def __init__(self, step: int, total: int, checkpoint_dir: Path) -> None:
        super().__init__(f"testbed pre-training paused at step {step}/{total}; checkpoint {checkpoint_dir}")
        self.step, self.total, self.checkpoint_dir = step, total, checkpoint_dir


def _lr_factor(spec: TestbedSpec, step: int) -> float:
    """Learning-rate factor of optimizer step ``step`` (0-based): linear warm-up over 5 % of the steps,
    then cosine decay from 1 to 0.1."""
    warm = max(1, spec.steps // 20)
    if step < warm:
        return (step + 1) / warm
    p = (step - warm) / max(1, spec.steps - warm)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))


def _rng_to_json(state: tuple) -> list:
    return [state[0], list(state[1]), state[2]]


def _rng_from_json(state: list) -> tuple:
    return (state[0], tuple(state[1]), state[2])


def _save_checkpoint(ckpt: Path, model: Any, opt: Any, step: int, rng: random.Random, losses: list[float],
                     seconds: float, spec: TestbedSpec) -> None:
    """Write model (safetensors), optimizer state and ``state.json`` (step, data-stream RNG state,
    losses, elapsed seconds) into ``ckpt``; ``state.json`` is replaced last and atomically, so a
    checkpoint cut mid-write is never read as complete (its ``step`` still names the files' step
    only after every file of that step is in place)."""
    from safetensors.torch import save_model

    ckpt.mkdir(parents=True, exist_ok=True)
    tmp = ckpt / f".step{step}"
    tmp.mkdir(exist_ok=True)
    save_model(model, str(tmp / "model.safetensors"))
    torch.save(opt.state_dict(), tmp / "optim.pt")
    state = {"step": step, "rng": _rng_to_json(rng.getstate()), "losses": losses, "seconds": seconds,
             "key": spec.key(), "dir": tmp.name}
    (tmp / "state.json").write_text(json.dumps(state))
    os.replace(tmp / "state.json", ckpt / "state.json.new")
    os.replace(ckpt / "state.json.new", ckpt / "state.json")
    for old in ckpt.glob(".step*"):
        if old.name != tmp.name:
            shutil.rmtree(old, ignore_errors=True)


def _load_checkpoint(ckpt: Path, model: Any, opt: Any, spec: TestbedSpec) -> tuple[int, tuple, list[float], float] | None:
    """Restore a checkpoint written by :func:`_save_checkpoint`; ``None`` when there is none.

    Raises:
        ValueError: the checkpoint belongs to a different spec (its key differs).
    """
    from safetensors.torch import load_model

    f = ckpt / "state.json"
    if not f.is_file():
        return None
    state = json.loads(f.read_text())
    if state.get("key") != spec.key():
        raise ValueError(f"testbed checkpoint {ckpt} is for spec key {state.get('key')!r}, not {spec.key()!r}; "
                         "delete the folder to start afresh")
    d = ckpt / state["dir"]
    load_model(model, str(d / "model.safetensors"))
    opt.load_state_dict(torch.load(d / "optim.pt", weights_only=True))
    return int(state["step"]), _rng_from_json(state["rng"]), list(state["losses"]), float(state["seconds"])


def pretrain(spec: TestbedSpec, *, log_every: int = 0, progress: bool = True,
             checkpoint_dir: str | os.PathLike | None = None, save_every: int = 100,
             max_seconds: float | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """Pre-train a testbed model from scratch (deterministic for ``spec``: same spec, same weights).

    ``progress`` shows a bar on stderr (steps, loss, ETA; lines in a log file, :mod:`rlvr.util.progress`).

    Resumable: with ``checkpoint_dir``, the model, optimizer, data-stream RNG state and losses are
    saved there every ``save_every`` steps, and a later call resumes from the last checkpoint. The
    result is bit-identical to one uninterrupted run (tested), so a long pre-training can be done in
    chunks: with ``max_seconds`` the call saves and raises :class:`PretrainPaused` once that much
    time has passed in this call (interpretation: a chunk fits one ≤ 9-minute heavy-lock hold, the
    rule of this project's shared machine).

    Returns:
        ``(model, tokenizer, info)``; ``info`` has ``final_loss`` (mean next-token cross-entropy in
        nats over the last 10 % of steps), ``seconds`` (summed over chunks), ``num_parameters``,
        ``loss_curve`` (mean loss per 10 % of the steps) and the spec.

    Raises:
        PretrainPaused: ``max_seconds`` ran out before the last step (progress is in the checkpoint).
        ValueError: ``max_seconds`` without ``checkpoint_dir``; a checkpoint of another spec.
    """
    if max_seconds is not None and checkpoint_dir is None:
        raise ValueError("pretrain: max_seconds needs a checkpoint_dir to save the progress in")
    tok = build_tokenizer(v2=spec.is_v2, tools=spec.has_tools)
    model = build_model(spec, tok)
    model.train()
    rng = random.Random(spec.seed * 7919 + 17)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate * _lr_factor(spec, 0), weight_decay=0.01,
                            betas=(0.9, 0.98))
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    start, losses, before = 0, [], 0.0
    if ckpt is not None:
        got = _load_checkpoint(ckpt, model, opt, spec)
        if got is not None:
            start, rng_state, losses, before = got
            rng.setstate(rng_state)
    t0 = time.perf_counter()
    from rlvr.util.progress import progress_bar

    bar = progress_bar(total=spec.steps, initial=start, desc="testbed pre-training (first use, then cached)",
                       unit="step", delay=2.0, disable=not progress)
    for step in range(start, spec.steps):
        losses.append(_pretrain_step(model, opt, rng, spec, tok, step))
        bar.update(1)
        if (step + 1) % 50 == 0:
            bar.set_postfix(loss=f"{sum(losses[-50:]) / 50:.3f}", refresh=False)
        if log_every and (step + 1) % log_every == 0:
            print(f"testbed pretrain step {step + 1}/{spec.steps} loss {sum(losses[-log_every:]) / log_every:.3f}", flush=True)
        done = step + 1
        if ckpt is not None and done < spec.steps:
            out_of_time = max_seconds is not None and time.perf_counter() - t0 >= max_seconds
            if out_of_time or done % save_every == 0:
                _save_checkpoint(ckpt, model, opt, done, rng, losses, before + time.perf_counter() - t0, spec)
            if out_of_time:
                bar.close()
                raise PretrainPaused(done, spec.steps, ckpt)
    bar.close()
    model.eval()
    return model, tok, _pretrain_info(spec, model, losses, before + time.perf_counter() - t0)


def _pretrain_step(model: Any, opt: torch.optim.Optimizer, rng: random.Random, spec: TestbedSpec, tok: Any,
                   step: int) -> float:
    """One pre-training update at ``step`` (0-based): the scheduled learning rate, a batch drawn from
    ``rng``, the next-token loss (the v2 loss for v2 presets), gradient clipping at 1, the AdamW step.
    Returns the batch's mean loss (nats per token)."""
    for g in opt.param_groups:  # the value LambdaLR gave before (base lr × factor): same floats
        g["lr"] = spec.learning_rate * _lr_factor(spec, step)
    ids, lab = _batch(rng, spec, tok)
    opt.zero_grad(set_to_none=True)
    loss = _v2_loss(model, ids, lab, tok.pad_token_id) if spec.is_v2 else None
    if loss is None:
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=lab)
        out.loss.backward()
        loss = out.loss
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def _pretrain_info(spec: TestbedSpec, model: Any, losses: list[float], seconds: float) -> dict[str, Any]:
    """:func:`pretrain`'s ``info``: the spec, the final loss (mean over the last 10 % of steps), the seconds
    (all chunks), the parameter count and the loss curve (mean per 10 % of the steps)."""
    tail = losses[-max(1, spec.steps // 10):]
    tenth = max(1, len(losses) // 10)
    return {
        "spec": dataclasses.asdict(spec),
        "final_loss": sum(tail) / len(tail),
        "seconds": round(seconds, 1),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "loss_curve": [round(sum(losses[i:i + tenth]) / len(losses[i:i + tenth]), 4)
                       for i in range(0, len(losses), tenth)],
    }


def testbed_cache_dir(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Folder a testbed model is cached in: ``<root>/<preset>-seed<k>-<hash>`` (not created)."""
    preset, spec = parse_spec(name)
    root = Path(cache_dir).expanduser() if cache_dir else CACHE_ROOT.expanduser()
    return root / f"{preset}-seed{spec.seed}-{spec.key()}"


def ensure_testbed_model(name: str = "testbed", cache_dir: str | os.PathLike | None = None, *,
                         log_every: int = 0, max_seconds: float | None = None) -> Path:
    """Return the cached folder of testbed model ``name``, pre-training and saving it on first use.

    The folder is written under a temporary name and renamed into place (atomic). Builds of one
    name are serialised by an exclusive lock on ``<folder>.lock``, so concurrent callers (e.g. the
    two workers of ``rlvr compare --jobs 2``) pre-train once and the second one loads the result.
    Progress is checkpointed in ``<folder>.partial`` (every 100 steps): a build that is killed or
    paused resumes there (:func:`pretrain`); with ``max_seconds`` this call pre-trains for at most
    that long and raises :class:`PretrainPaused` if the model is not finished
    (``python -m rlvr.testbed.build NAME --max-seconds S``). The folder holds
    ``model.safetensors``, the tokenizer with its chat template, and ``testbed.json`` (spec, final
    loss, loss curve, build time).

    Raises:
        ValueError: see :func:`parse_spec`.
        PretrainPaused: ``max_seconds`` ran out first.
    """
    import fcntl

    target = testbed_cache_dir(name, cache_dir)
    if (target / "config.json").is_file():
        return target
    _, spec = parse_spec(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():  # built by the holder we waited for
            return target
        partial = target.parent / f"{target.name}.partial"
        model, tok, info = pretrain(spec, log_every=log_every, checkpoint_dir=partial, max_seconds=max_seconds)
        # the lock holder is the only writer of this target's staging folders: earlier ones are leftovers
        remove_stale(target.parent, lambda i: i["name"] == target.name, owned_by_caller=True)

        def write(tmp: Path) -> None:
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
            (tmp / "testbed.json").write_text(json.dumps(info, indent=2) + "\n")

        publish_folder(target, write)
        shutil.rmtree(partial, ignore_errors=True)
    return target
