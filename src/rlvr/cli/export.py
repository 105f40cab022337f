"""``rlvr export``: a LoRA adapter folder merged into its base model."""

from __future__ import annotations

import argparse


def cmd_export(args: argparse.Namespace) -> int:
    """``rlvr export FOLDER --merge --out DIR``: base + LoRA adapter merged into one HF model folder."""
    from rlvr.config import ModelConfig
    from rlvr.lora import export_merged

    path = export_merged(args.folder, args.out, ModelConfig())
    print(f"rlvr: wrote {path}")
    return 0
