"""A run's trained model in MLflow: what ``export mlflow`` (and the end of ``run --mlflow``)
logs beside the run's metrics, so that MLflow gives it back::

    import mlflow.pytorch
    model = mlflow.pytorch.load_model("runs:/<run id>/model")   # logits of (N, 3, size, size)

The model is the run's final weights (its snapshot, as ``ddlstudy export model`` reads
them) in MLflow's PyTorch flavour, saved as ``torch.export`` saves a program ("pt2"): no
pickle, and no Python code of the model needed to load it, so a model of one's own
(``--model file.py:FUNCTION``) loads in a fresh process as a torchvision one does. Its batch
size is free, its image size the run's. Beside it, ``usecase.json``: the use case and the
preprocessing a new image needs (size, mean, std, class names), also in the model's
metadata. A run kept with ``--no-snapshot`` has no model to log; a model already logged
from the same snapshot is not logged again (a resumed run's newer one replaces it). A model
that cannot be logged is said in a warning: the rest of the run is logged all the same.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch

from ddlstudy.models.sources import sha256_of
from ddlstudy.models.trained import trained

log = logging.getLogger("ddlstudy")

MODEL = "model"
"""The logged model's name: ``runs:/<run id>/model``."""
USECASE = "usecase.json"
"""The use case and preprocessing, in the model's folder (``ddlstudy export model``'s
sidecar as it is)."""
DIGEST_TAG = "ddlstudy_snapshot_sha256"
"""The logged model's tag: the sha256 of the snapshot it was made from."""
SNAPSHOT = "snapshot.pt"
EXAMPLE_BATCH = 2
"""Images in the example ``torch.export`` traces (2, so that the batch size stays free)."""


def log_model(mlflow, experiment_id: str, run_id: str, folder: Path, tmp: Path) -> str | None:
    """Log the model of the run folder ``folder`` under MLflow run ``run_id``; returns the
    logged model's id (None: no snapshot, already logged, or a failure said in a warning)."""
    snapshot = Path(folder) / SNAPSHOT
    if not snapshot.is_file():  # --no-snapshot, or ended before its first epoch
        return None
    try:
        digest = sha256_of(snapshot)
        logged = _logged(mlflow, experiment_id, run_id)
        if any(m.tags.get(DIGEST_TAG) == digest and str(m.status) == "READY" for m in logged):
            return None
        model_id = _log(mlflow, experiment_id, run_id, Path(folder), Path(tmp), digest)
    except Exception as exc:  # noqa: BLE001 - the run's metrics and files are logged still
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        log.warning("MLflow: the model of run %s is not logged (%s); its metrics and files "
                    "are", Path(folder).name, text)
        return None
    for old in logged:  # an earlier snapshot's model, or one left half logged
        _forget(mlflow, old.model_id)
    return model_id


def _forget(mlflow, model_id: str) -> None:
    """Delete a logged model that is not (or no longer) the run's; a store that fails
    here leaves it, which the next export tries again."""
    try:
        mlflow.delete_logged_model(model_id)
    except Exception as exc:  # noqa: BLE001
        log.debug("MLflow: could not delete logged model %s: %s", model_id, exc)


def _logged(mlflow, experiment_id: str, run_id: str) -> list:
    """The models named ``MODEL`` that run ``run_id`` has logged."""
    found, token = [], None
    while True:
        page = mlflow.search_logged_models(
            [experiment_id], filter_string=f"name = '{MODEL}' AND source_run_id = '{run_id}'",
            page_token=token)
        found += [m for m in page if m.source_run_id == run_id]
        token = page.token
        if not token:
            return found


def _log(mlflow, experiment_id: str, run_id: str, folder: Path, tmp: Path,
         digest: str) -> str:
    """Export the run's weights, trace its model and upload it as a new logged model (made
    READY only once all of it is there; deleted where anything failed)."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model
    from mlflow.pytorch import save_model

    work = tmp / "models" / folder.name
    shutil.rmtree(work, ignore_errors=True)
    model, _, described = trained(folder)
    model.eval()
    made = mlflow.create_logged_model(experiment_id, name=MODEL, source_run_id=run_id,
                                      tags={DIGEST_TAG: digest,
                                            "ddlstudy_run_id": described.get("run") or ""})
    try:
        saved = work / MODEL
        info = Model(artifact_path=made.artifact_location, model_uuid=made.model_id,
                     run_id=run_id, model_id=made.model_id,
                     metadata={"preprocessing": described["preprocessing"],
                               "classes": described["classes"]})
        size = int(described["preprocessing"]["size"])
        save_model(model, str(saved), mlflow_model=info, serialization_format="pt2",
                   signature=_signature(size, len(described["classes"])),
                   input_example=(torch.zeros(EXAMPLE_BATCH, 3, size, size),),
                   pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"])
        (saved / USECASE).write_text(json.dumps(described, indent=2))
        mlflow.log_model_artifacts(made.model_id, str(saved))
        mlflow.log_outputs(run_id, [LoggedModelOutput(made.model_id, step=0)])
        mlflow.finalize_logged_model(made.model_id, LoggedModelStatus.READY)
    except BaseException:
        _forget(mlflow, made.model_id)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return made.model_id


def _signature(size: int, classes: int):
    """Images in (any batch, 3, size, size) float32, logits out (any batch, classes)."""
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    return ModelSignature(Schema([TensorSpec(np.dtype(np.float32), (-1, 3, size, size))]),
                          Schema([TensorSpec(np.dtype(np.float32), (-1, classes))]))
