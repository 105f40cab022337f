"""A reward with within-group variance for a random tiny model: 1 for an even-length completion."""


def even_length(completion: str, problem) -> float:
    """1.0 when ``len(completion)`` is even, else 0.0."""
    return float(len(completion) % 2 == 0)
