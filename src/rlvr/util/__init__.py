"""Small pure helpers every layer may use (layer 0 of ``docs/architecture.md``: they import nothing from
rlvr): :mod:`~rlvr.util.staging` (atomic folder writes and their leftovers), :mod:`~rlvr.util.file_kinds`
(refusing inputs that are not regular files), :mod:`~rlvr.util.text` (counts in messages) and
:mod:`~rlvr.util.progress` (tqdm bars, or a line every 30 s off a terminal). Import the module you need;
this package re-exports nothing, so importing one loads only it.
"""
