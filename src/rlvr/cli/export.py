"""``rlvr export``: a LoRA adapter folder merged into its base model."""

from __future__ import annotations

import argparse
from pathlib import Path


def _check_out(out: Path) -> None:
    """``--out`` must be usable before the merge (minutes of loading) starts: not a file or a link, and its folder
    writable (a probe file is made and removed in its parent, which is created as the export would).

    Raises:
        OutputDirError: naming ``--out`` and the reason (exit 2).
    """
    from rlvr.errors import OutputDirError
    from rlvr.trainer.run_dir import check_writable_dir

    if out.is_symlink():  # the rename into place would replace the link, not fill the folder it names
        raise OutputDirError(f"--out {out}: is a symbolic link (to {out.resolve()}): give that folder itself")
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"--out {out}: is a file, not a folder (nothing is overwritten)")
    try:
        check_writable_dir(out.parent, key="its parent folder")
        if out.is_dir():
            check_writable_dir(out, key="the folder")
    except OutputDirError as exc:
        raise OutputDirError(f"--out {out}: {exc}") from None


def cmd_export(args: argparse.Namespace) -> int:
    """``rlvr export FOLDER --merge --out DIR``: base + LoRA adapter merged into one HF model folder.

    Registers the model sources ``rlvr train`` knows (the testbed policy), so an adapter trained on any of
    them exports offline.
    """
    import rlvr.testbed  # noqa: F401 (registers the testbed's model source, as rlvr train does)
    from rlvr.config import ModelConfig
    from rlvr.lora import export_merged

    _check_out(Path(args.out).expanduser())
    path = export_merged(args.folder, args.out, ModelConfig())
    print(f"rlvr: wrote {path}")
    return 0
