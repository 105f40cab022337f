"""Experiment trackers a run reports to besides ``metrics.jsonl``: TensorBoard, Weights & Biases, MLflow.

``logging.report_to`` lists them (default ``[tensorboard]``). Every tracker receives the very dict of
scalars that becomes a ``metrics.jsonl`` row (same slash names, same optimizer step; non-finite values
are left out, as in TensorBoard), and the resolved configuration once, when its run is created.

* ``wandb`` (``pip install 'rlvr[wandb]'``): ``wandb.init(project=logging.wandb_project,
  entity=logging.wandb_entity, name=logging.run_name or the output folder's name, dir=OUTPUT_DIR,
  config=...)``; ``WANDB_MODE=offline`` works without network. The run id is kept in
  ``OUTPUT_DIR/tracker_runs.json``; a resumed rlvr run (``--resume``) continues **the same W&B run**
  (``resume="allow"`` with that id) instead of starting a new one, and does not log the config again.
  Steps re-done after the checkpoint carry the same values (resume is exact); W&B drops the
  duplicates it already holds.
* ``mlflow`` (``pip install 'rlvr[mlflow]'``, the ``mlflow-skinny`` client): tracking URI
  ``logging.mlflow_tracking_uri``, else ``MLFLOW_TRACKING_URI``, else ``file:OUTPUT_DIR/mlruns``;
  experiment ``logging.mlflow_experiment``. The config is logged once as flattened params and as
  ``config.json``; a resumed run continues the same MLflow run id. MLflow ≥ 3.7 refuses ``file:``
  stores unless ``MLFLOW_ALLOW_FILE_STORE=true``; rlvr sets that (if unset) only when the URI it uses
  is a ``file:`` one, because the user asked for exactly that store. A file store keeps each metric
  as a file under folders named by its slash path, so there (only) a name that is also a folder
  (``actor/ratio`` beside ``actor/ratio/min``) is stored as ``actor/ratio/value``
  (:meth:`MlflowTracker.metric_name`).

A tracker whose package is missing is reported by :func:`check_report_to` as a configuration error
naming the extra to install — the CLI calls it before any model loads.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from pathlib import Path
from urllib.parse import urlparse
from typing import Any, Mapping, Protocol

from rlvr.errors import ConfigError

RUN_IDS_FILE = "tracker_runs.json"
# tracker name -> (module to import, extra, pinned pip spec)
OPTIONAL = {"wandb": ("wandb", "rlvr[wandb]", "wandb==0.31.0"),
            "mlflow": ("mlflow", "rlvr[mlflow]", "mlflow-skinny==3.17.2")}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: sys.modules[module] is None (blocked)
        return False


def check_report_to(report_to: list[str]) -> None:
    """Fail fast when a listed tracker's package is not installed, or W&B has no credentials (issue 25,
    item 4.7: ``wandb.init`` used to fail only after the model had loaded).

    Raises:
        ConfigError: names the tracker, the ``logging.report_to`` key and the extra to install (or,
            for W&B, where a key is looked for and how to give one).
    """
    for name in report_to:
        if name in OPTIONAL and not _installed(OPTIONAL[name][0]):
            module, extra, spec = OPTIONAL[name]
            raise ConfigError(
                f"logging.report_to includes {name!r} but the {module!r} package is not installed: "
                f"pip install '{extra}' (or: pip install {spec}), or remove {name} from logging.report_to"
            )
        if name == "wandb" and not _wandb_can_log_in():
            raise ConfigError(
                "logging.report_to includes 'wandb' but no W&B API key was found (WANDB_API_KEY, or a "
                f"{_wandb_host()} entry in ~/.netrc from `wandb login`): run `wandb login`, set WANDB_API_KEY, "
                "set WANDB_MODE=offline to log locally, or remove wandb from logging.report_to"
            )


def _wandb_host() -> str:
    return urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"


def _wandb_can_log_in() -> bool:
    """Whether ``wandb.init`` will find credentials, checked without importing wandb (seconds) or the network.

    Interpretation of where wandb looks (its docs, "wandb login"): ``WANDB_API_KEY``, then the netrc file
    (``NETRC``, else ``~/.netrc`` or ``~/_netrc``) entry for the ``WANDB_BASE_URL`` host, then an ``api_key`` in
    the global settings file (``WANDB_CONFIG_DIR/settings``); ``WANDB_MODE=offline`` / ``disabled``
    (and ``dryrun``) need no key, nor does an identity-token file (``WANDB_IDENTITY_TOKEN_FILE``).
    """
    import netrc

    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return True
    if os.environ.get("WANDB_IDENTITY_TOKEN_FILE") or os.environ.get("WANDB_DISABLED", "").lower() in ("true", "1"):
        return True
    config_dir = os.environ.get("WANDB_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".config", "wandb")
    try:  # the global settings file may carry api_key too
        if "api_key" in Path(config_dir, "settings").read_text(encoding="utf-8", errors="replace"):
            return True
    except OSError:
        pass
    home = os.path.expanduser("~")
    paths = [os.environ["NETRC"]] if os.environ.get("NETRC") else [os.path.join(home, ".netrc"), os.path.join(home, "_netrc")]
    for path in paths:
        try:
            entry = netrc.netrc(path).authenticators(_wandb_host())
        except (OSError, netrc.NetrcParseError):
            continue
        if entry and entry[2]:
            return True
    return False


class Tracker(Protocol):
    """What :class:`rlvr.trainer.logger.RunLogger` drives."""

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """Record finite scalars for optimizer step ``step``."""

    def close(self) -> None:
        """Flush and end the tracker's run (it may be resumed later)."""


def finite_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The entries of ``metrics`` that are finite int/float values, as floats (bools excluded)."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


def flatten_config(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out.update(flatten_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class _RunIds:
    """``OUTPUT_DIR/tracker_runs.json``: tracker name -> run id, written atomically."""

    def __init__(self, output_dir: Path) -> None:
        self.path = Path(output_dir) / RUN_IDS_FILE

    def get(self, name: str) -> str | None:
        try:
            return json.loads(self.path.read_text()).get(name)
        except (OSError, ValueError):
            return None

    def set(self, name: str, run_id: str) -> None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            data = {}
        data[name] = run_id
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(self.path)


class WandbTracker:
    """Weights & Biases: one W&B run per rlvr run, continued on resume (see the module docstring).

    Args:
        output_dir: the run directory (W&B files go under ``output_dir/wandb``).
        config: the resolved configuration, logged when the W&B run is created.
        logging_cfg: :class:`rlvr.config.LoggingConfig` (project, entity, run name).
        resume: continue the run id recorded in ``tracker_runs.json`` if there is one.
    """

    def __init__(self, output_dir: Path, config: Mapping[str, Any], logging_cfg: Any, *, resume: bool) -> None:
        import wandb

        ids = _RunIds(output_dir)
        run_id = ids.get("wandb") if resume else None
        kw: dict[str, Any] = dict(project=logging_cfg.wandb_project, entity=logging_cfg.wandb_entity,
                                  name=logging_cfg.run_name or Path(output_dir).resolve().name, dir=str(output_dir))
        if run_id:
            self.run = wandb.init(id=run_id, resume="allow", **kw)
        else:
            self.run = wandb.init(config=dict(config), **kw)
        self.resumed = bool(run_id)
        ids.set("wandb", self.run.id)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """``run.log(scalars, step=step)``."""
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        """``run.finish()``."""
        self.run.finish()


class MlflowTracker:
    """MLflow through ``MlflowClient`` (no global active run): one MLflow run per rlvr run, continued
    on resume. Args as :class:`WandbTracker`."""

    def __init__(self, output_dir: Path, config: Mapping[str, Any], logging_cfg: Any, *, resume: bool) -> None:
        uri = logging_cfg.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or \
            f"file:{Path(output_dir).resolve() / 'mlruns'}"
        if urlparse(uri).scheme in ("", "file"):  # a local file store: what the user asked for
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.uri = uri
        ids = _RunIds(output_dir)
        run_id = ids.get("mlflow") if resume else None
        self.resumed = bool(run_id)
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
        else:
            exp = self.client.get_experiment_by_name(logging_cfg.mlflow_experiment)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(logging_cfg.mlflow_experiment)
            run = self.client.create_run(exp_id, run_name=logging_cfg.run_name or Path(output_dir).resolve().name)
            run_id = run.info.run_id
            params = [Param(k, json.dumps(v) if not isinstance(v, str) else v)
                      for k, v in flatten_config(config).items()]
            for i in range(0, len(params), 100):  # MLflow's batch limit
                self.client.log_batch(run_id, params=[Param(p.key, p.value[:6000]) for p in params[i : i + 100]])
            self.client.log_dict(run_id, dict(config), "config.json")
            ids.set("mlflow", run_id)
        self.run_id = run_id
        self.file_store = urlparse(uri).scheme in ("", "file")
        self._leaves: set[str] = set()  # names stored as files so far (file store only)
        self._dirs: set[str] = set()  # name prefixes stored as folders so far

    def metric_name(self, name: str, batch: Mapping[str, Any]) -> str:
        """The name ``name`` is stored under: itself, except in a ``file:`` store, which keeps each
        metric as a file in folders named by its slash path — there a name that is also another's
        folder (``actor/ratio`` beside ``actor/ratio/min``) becomes ``<name>/value``, and a name under
        an existing file gets ``_`` for the clashing ``/``. Database and server stores get every
        name unchanged."""
        if not self.file_store:
            return name
        if name in self._dirs or any(k.startswith(name + "/") for k in batch):
            name = name + "/value"
        parts = name.split("/")
        for i in range(1, len(parts)):
            head = "/".join(parts[:i])
            if head in self._leaves:
                name = head + "_" + "/".join(parts[i:])
                break
        return name

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """One ``log_batch`` of metrics at ``step`` (names: :meth:`metric_name`)."""
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        metrics = []
        for k, v in scalars.items():
            name = self.metric_name(k, scalars)
            if self.file_store:
                self._leaves.add(name)
                parts = name.split("/")
                self._dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
            metrics.append(Metric(name, v, ts, step))
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self) -> None:
        """Mark the MLflow run finished."""
        self.client.set_terminated(self.run_id)


def build_trackers(report_to: list[str], output_dir: str | Path, config: Mapping[str, Any], logging_cfg: Any,
                   *, resume: bool) -> list[Tracker]:
    """The W&B / MLflow trackers ``report_to`` names (TensorBoard is built in to the run logger).

    Raises:
        ConfigError: a listed tracker's package is missing (:func:`check_report_to`).
    """
    check_report_to(report_to)
    out: list[Tracker] = []
    try:
        for name in report_to:
            if name == "wandb":
                out.append(WandbTracker(Path(output_dir), config, logging_cfg, resume=resume))
            elif name == "mlflow":
                out.append(MlflowTracker(Path(output_dir), config, logging_cfg, resume=resume))
    except BaseException:
        for t in out:
            t.close()
        raise
    return out
