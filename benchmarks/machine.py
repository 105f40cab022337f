"""What every benchmark prints first: the CPU, its capability and its measured fp32 / bf16 matmul rates.

Machines of the same kind come with different CPUs (AVX2-only vs AVX-512 with ``avx512_bf16``), and the
precision ``model.dtype=auto`` picks depends on it (``rlvr.precision``), so a number means little without
these. Imported by the scripts in this folder (``python benchmarks/<script>.py`` puts the folder on
``sys.path``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from rlvr.precision import cpu_description, matmul_rates, resolve_precision


def print_machine(shape: tuple[int, int, int] = (512, 576, 1536)) -> dict[str, Any]:
    """Print the CPU line, the matmul rates of ``torch.mm [m,k]@[k,n]`` in fp32 and bf16 and what
    ``model.dtype=auto`` resolves to, with the UTC time and the load average (``os.getloadavg``: the
    machines are shared, so a timing means little without it); return them as a JSON-serialisable dict.

    The default shape is issue 15's (SmolLM2-135M's hidden → MLP projection over 512 rows).
    """
    cpu = cpu_description()
    m, k, n = shape
    rates = matmul_rates(m, k, n)
    auto = resolve_precision("auto", log=False)
    when, load = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), [round(x, 2) for x in os.getloadavg()]
    print(f"{when}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs", flush=True)
    print(f"CPU: {cpu['model']}; torch capability {cpu['capability']}; vector flags {' '.join(cpu['vector_flags'])}; "
          f"bf16 flags: {' '.join(cpu['bf16_flags']) or 'none'}", flush=True)
    print(f"matmul {m}x{k}x{n} GFLOP/s ({torch.get_num_threads()} threads, torch {torch.__version__}): "
          f"fp32 {rates['float32']:.1f}, bf16 {rates['bfloat16']:.1f} (bf16/fp32 = "
          f"{rates['bfloat16'] / rates['float32']:.2f}); model.dtype=auto -> {auto.mode} ({auto.reason})", flush=True)
    return {"cpu": cpu, "matmul_shape": list(shape), "matmul_gflop_per_s": rates, "auto": auto.as_dict(),
            "time_utc": when, "loadavg": load}


def write_result(out: str | Path | None, res: dict[str, Any]) -> None:
    """Write a benchmark's result dict to ``out`` as indented JSON (parents created; nothing when ``out`` is
    None). Values JSON cannot encode are written as their ``str``."""
    if not out:
        return
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(res, indent=2, default=str))
