"""A reward with within-group variance for a random tiny model: 1 for an even-length completion."""


def even_length(completion: str, problem) -> float:
    """1.0 when ``len(completion)`` is even, else 0.0."""
    return float(len(completion) % 2 == 0)


def even_length_failing_on_rank_1(completion: str, problem) -> float:
    """:func:`even_length`, except that every call raises in the torchrun process of ``RANK`` 1."""
    import os

    if os.environ.get("RANK") == "1":
        raise RuntimeError("rank 1's reward service is unreachable")
    return even_length(completion, problem)
