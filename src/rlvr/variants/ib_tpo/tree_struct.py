"""IB-TPO's data structures: step segmentation of a completion, the per-prompt tree of token-id spans
(:class:`PromptTree`, :class:`TreeNode`) and the index the trainer-side math reads (:class:`TreeIndex`).

Source: ``docs/ib_tpo.md`` §2.1 (steps, tree) and §2.7 (extraction). The tree stores the exact
sampled token ids and behaviour log-probs; text is never re-tokenized. The sampler that grows these
trees is :mod:`rlvr.variants.ib_tpo.sampler`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from rlvr.types import Generation

__all__ = ["PromptTree", "TokenTexts", "TreeIndex", "TreeNode", "segment_steps"]


# --------------------------------------------------------------------------------------------------
# step segmentation


class TokenTexts:
    """Decoded text of single token ids, cached (``tokenizer.decode([id])``).

    Byte-level BPE pieces that are not whole UTF-8 characters decode to a replacement character,
    which is harmless for finding ``"\\n"`` delimiters.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        s = self._cache.get(token_id)
        if s is None:
            s = self.tokenizer.decode([int(token_id)], skip_special_tokens=False)
            self._cache[token_id] = s
        return s


def segment_steps(
    token_ids: Sequence[int],
    text_of: Callable[[int], str] | None = None,
    *,
    split: str = "paragraph",
    delimiter: str = "\n\n",
    min_tokens: int = 16,
    max_tokens: int = 512,
    fixed_tokens: int = 256,
) -> list[int]:
    """Exclusive end offsets of the steps of ``token_ids`` (the last one is ``len(token_ids)``).

    ``paragraph`` (spec §2.1): a boundary sits after the token whose decoded text completes an
    occurrence of ``delimiter`` (also when the delimiter straddles two tokens, e.g. ``"\\n"`` +
    ``"\\n"``); steps shorter than ``min_tokens`` merge into the next step; steps longer than
    ``max_tokens`` are split after the last token containing ``"\\n"`` within the cap, or hard-cut at
    the cap. The final step ends at the end of the span (EOS or cap) and may be short.
    ``fixed``: consecutive segments of ``fixed_tokens`` tokens (TreePO / SPO style).

    Args:
        token_ids: ``[L]`` token ids of one generated span.
        text_of: id → decoded text (:class:`TokenTexts`); required for ``paragraph``.

    Returns:
        Strictly increasing offsets in ``(0, L]``; ``[]`` for an empty span.

    Raises:
        ValueError: unknown ``split``, a non-positive size, or ``paragraph`` without ``text_of``.
    """
    L = len(token_ids)
    if split not in ("paragraph", "fixed"):
        raise ValueError(f"segment_steps: split must be paragraph or fixed, got {split!r}")
    if min(min_tokens, max_tokens, fixed_tokens) < 1:
        raise ValueError("segment_steps: min_tokens, max_tokens and fixed_tokens must be >= 1")
    if L == 0:
        return []
    if split == "fixed":
        return list(range(fixed_tokens, L, fixed_tokens)) + [L]
    if text_of is None:
        raise ValueError("segment_steps: split=paragraph needs text_of (token id -> text)")
    texts = [text_of(int(t)) for t in token_ids]
    raw: list[int] = []
    keep = len(delimiter) - 1
    tail = ""  # the last len(delimiter) - 1 characters since the previous boundary
    for t, s in enumerate(texts):
        window = tail + s
        if delimiter in window:
            if t + 1 < L:
                raw.append(t + 1)
            tail = ""  # an occurrence is used once
        else:
            tail = window[-keep:] if keep else ""
    raw.append(L)
    merged: list[int] = []
    prev = 0
    for e in raw:  # merge short steps into the next one
        if e - prev >= min_tokens or e == L:
            merged.append(e)
            prev = e
    out: list[int] = []
    prev = 0
    for e in merged:  # cap long steps
        while e - prev > max_tokens:
            cut = None
            for t in range(prev + max_tokens - 1, prev, -1):
                if "\n" in texts[t]:
                    cut = t + 1
                    break
            cut = cut or prev + max_tokens
            out.append(cut)
            prev = cut
        out.append(e)
        prev = e
    return out


# --------------------------------------------------------------------------------------------------
# the tree


@dataclass
class TreeNode:
    """One step: a span of sampled token ids with their behaviour log-probs.

    Attributes:
        parent: parent node id (-1 for the root, the prompt).
        tokens / logps: the span's ids and natural-log behaviour probabilities ``[L_u]``.
        start: tokens generated on the path before this span (the fork offset of its first token).
        depth: steps from the root (root 0).
        children: child node ids.
        finish: ``"eos"`` / ``"length"`` for a leaf, else None.
        reward / correct / text / feedback: the verifier's result on the leaf's whole path.
        round: the sampling round that created the node (1 = initial chains).
    """

    parent: int
    tokens: list[int]
    logps: list[float]
    start: int
    depth: int
    children: list[int] = field(default_factory=list)
    finish: str | None = None
    reward: float = 0.0
    correct: bool = False
    text: str | None = None
    feedback: str | None = None
    round: int = 0

    @property
    def end(self) -> int:
        """Path length (generated tokens) from the root through the end of this span."""
        return self.start + len(self.tokens)


class PromptTree:
    """A trie of token-id spans rooted at one prompt (spec §2.1). Node 0 is the root (no tokens)."""

    def __init__(self, prompt_index: int, prompt_ids: Sequence[int]) -> None:
        self.prompt_index = prompt_index
        self.prompt_ids = list(prompt_ids)
        self.nodes: list[TreeNode] = [TreeNode(parent=-1, tokens=[], logps=[], start=0, depth=0)]
        self.leaves: list[int] = []
        self.tokens_decode = 0
        self.tokens_prefill = 0
        self.tokens_discarded = 0
        self.rounds = 0
        self.branches = 0
        self.fork_fracs: list[float] = []
        self.done = False

    def parent_array(self) -> list[int]:
        """``[U]`` parent ids (the layout :mod:`rlvr.core.tree` takes)."""
        return [n.parent for n in self.nodes]

    def path_nodes(self, u: int) -> list[int]:
        """Node ids from the first step to ``u`` (root excluded)."""
        out = []
        while u > 0:
            out.append(u)
            u = self.nodes[u].parent
        return out[::-1]

    def path_tokens(self, u: int) -> list[int]:
        """Generated token ids on ``path(root → u)`` (the concatenation of the spans)."""
        return [t for v in self.path_nodes(u) for t in self.nodes[v].tokens]

    def path_logps(self, u: int) -> list[float]:
        """Behaviour log-probs on ``path(root → u)``."""
        return [x for v in self.path_nodes(u) for x in self.nodes[v].logps]

    def attach(self, u: int, gen: Generation, ends: Sequence[int], round_: int) -> int:
        """Attach a continuation of ``u`` as a chain of step nodes cut at ``ends``; returns the leaf id.

        Raises:
            ValueError: an empty continuation or ``ends`` not ending at its length.
        """
        L = len(gen.token_ids)
        if L == 0 or not ends or ends[-1] != L:
            raise ValueError(f"PromptTree.attach: bad continuation (length {L}, step ends {list(ends)})")
        prev, cur = 0, u
        for e in ends:
            parent = self.nodes[cur]
            node = TreeNode(
                parent=cur, tokens=list(gen.token_ids[prev:e]), logps=list(gen.logprobs[prev:e]),
                start=parent.end, depth=parent.depth + 1, round=round_,
            )
            self.nodes.append(node)
            parent.children.append(len(self.nodes) - 1)
            cur, prev = len(self.nodes) - 1, e
        self.nodes[cur].finish = gen.finish_reason
        self.leaves.append(cur)
        return cur


@dataclass
class TreeIndex:
    """What the trainer-side math needs of one extracted tree (stored in ``batch.tree_index`` as a dict).

    Attributes:
        group_id: the tree's group id in the batch.
        parent: ``[U]`` parent array; span_lengths / starts: ``[U]`` tokens per node and fork offsets.
        paths: one node list per leaf (root excluded), in the order of ``rows``.
        rows: batch row of each path.
        surprisal: per-node step surprisal ``h(u)`` (from the behaviour log-probs; reward-free).
        values, H, I, IB, A: per-node float lists (recursive values, IB quantities, final advantage),
            filled by the ``ib_tree`` advantage estimator from the batch's rewards.
    """

    group_id: int
    parent: list[int]
    span_lengths: list[int]
    starts: list[int]
    paths: list[list[int]]
    rows: list[int]
    surprisal: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    H: list[float] = field(default_factory=list)
    I: list[float] = field(default_factory=list)  # noqa: E741
    IB: list[float] = field(default_factory=list)
    A: list[float] = field(default_factory=list)
