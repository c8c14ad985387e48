"""One schema per file format ddlstudy writes and reads back: a run's manifest.json, a
study's study.json, advise.json, a data set's cache index and spec.

Each is a pydantic model: the types, the ranges and the required fields of the format.
Unknown fields pass (a newer ddlstudy may add some); a known field of the wrong type, out
of its range or missing is refused by ``load`` in one line naming the file, the field
and what it must be. Readers go through ``load`` (or ``check`` for a document already
parsed) and get the document back as a plain dict, valid. ``reference()`` writes the
formats' reference from these same models, so the docs cannot drift from the checks.

A person's use case and study plan: ``config.schema`` (unknown keys refused)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator as After
from pydantic import Field, ValidationError, create_model

from ddlstudy.config.run import options
from ddlstudy.config.schema import field_rows, finite
from ddlstudy.config.schema import problem as schema_problem
from ddlstudy.machine import phases, sampler
from ddlstudy.reading import CAPS, BadFile, read_json
from ddlstudy.records.advice import Advice, AdviceCheck
from ddlstudy.records.kinds import (
    Bytes,
    Count,
    Fraction,
    Loss,
    Name,
    Pid,
    Positive,
    Rate,
    Seconds,
    Sha256,
    Text,
)
from ddlstudy.records.kinds import Record as _Record

SCHEMA_VERSION = 1
"""The manifest's format version this ddlstudy writes and reads (runfolder.SCHEMA_VERSION
is the same; a test holds them equal): a newer one is refused, not misread."""
class Epoch(_Record):
    """One finished epoch."""
    epoch: Positive
    train_loss: Loss
    val_loss: Loss | None = None
    val_accuracy: Fraction | None
    val_macro_f1: Fraction | None = None  # + val_class_accuracy_<i>, val_top5_accuracy
    train_accuracy: Fraction | None = None
    train_images: Count | None = None
    steps: Count | None = None
    images_per_s: Seconds | None = None
    steady_images_per_s: Seconds  # a rate, >= 0
    train_time_s: Seconds | None = None
    epoch_time_s: Seconds
    elapsed_s: Seconds | None = None


class Summary(_Record):
    """What the tables compare; absent figures are null (a run with no finished epoch)."""
    epochs_done: Count = 0
    final_val_accuracy: Fraction | None = None
    best_val_accuracy: Fraction | None = None
    median_images_per_s: Rate | None = None
    median_epoch_time_s: Rate | None = None
    train_time_s: Seconds | None = None


class StrategyBlock(_Record):
    """The strategy as it ran: its name and layout."""
    name: str
    processes: Positive = 1
    threads_per_process: Positive = 1
    devices: Count = 0
    device: str | None = None
    stage_starts: list[Count] | None = None
    schedule: str | None = None


class RankExchange(_Record):
    """One rank's seconds over the run: computing, and in the gradient exchange."""
    rank: Count
    host: str
    steps: Count
    compute_s: Seconds
    exchange_s: Seconds


class Exchange(_Record):
    """What an MPI run measured of its exchange (``training.worker.record_exchange``)."""
    per_rank: list[RankExchange] = []
    note: str | None = None


_PARTS = ("step_s", "forward_s", "backward_s", "comm_s", "wait_s", "optimizer_s")
StageTime = create_model(
    "StageTime", __base__=_Record, __doc__="A pipeline stage's seconds over the run's steps.",
    rank=(Count, ...), pipeline=(Count, 0), stage=(Count, ...), steps=(Count, ...),
    **{p: (Seconds, ...) for p in _PARTS}, exchange_s=(Seconds, 0.0), other_s=(Seconds, 0.0),
    chunks=(Positive, 1), peak_micro_batches_held=(list[Count], []), activation_bytes=(
        list[Count], []), peak_activation_bytes=(Count, 0), peak_gpu_bytes=(Count | None, None))
StageBox = create_model(
    "StageBox", __base__=_Record, __doc__="A micro-batch's pass on a stage, from the step's "
    "start.", stage=(Count, ...), micro_batch=(Count, ...), phase=(Literal["forward",
    "backward"], ...), start_s=(Seconds, ...), end_s=(Seconds, ...), chunk=(Count, 0))
StagesTime = create_model(  # strategies.pipeline.stage_times; older runs have none
    "StagesTime", __base__=_Record, __doc__="What a pipeline run measured of its stages.",
    per_stage=(list[StageTime], []), timeline=(list[StageBox], []), note=(str | None, None),
    bound_step_s=(Seconds | None, None), of_bound=(float | None, None), transport=(
        str | None, None), replicas_transport=(str | None, None))


RankMemory = create_model(  # held_bytes: its own tensors' (a sharded strategy's shards)
    "RankMemory", __base__=_Record, __doc__="A process's memory while training.",
    rank=(Count, ...), host=(str, ...), peak_rss_bytes=(Bytes, ...), peak_method=(str, ...),
    held_bytes=(dict[str, Bytes], ...), **{k: (Bytes | None, None) for k in (
        "setup_rss_bytes", "setup_file_bytes", "end_file_bytes", "gpu_max_allocated_bytes",
        "gpu_max_reserved_bytes", "shmem_bytes", "shmem_pss_bytes")},
    training_faults=(Count | None, None))
Memory = create_model(  # training.worker.record_memory; hosts: hosts up --memory's cgroups
    "Memory", __base__=_Record, __doc__="What each process held (concepts: memory).",
    per_rank=(list[RankMemory], []), peak_rss_bytes=(Bytes | None, None), per_host_bytes=(
        dict[str, Bytes], {}), hosts=(dict[str, dict[str, Bytes | None]] | None, None))


class BackendBlock(_Record):
    """The backend and its nodes."""
    name: str
    nodes: Positive = 1
    reduce: str | None = None
    sync: str | None = None
    hosts: list[str] | None = None
    exchange: Exchange | None = None
    stages_time: StagesTime | None = None  # type: ignore[valid-type]
    memory: Memory | None = None  # type: ignore[valid-type]


class Data(_Record):
    """The data set it trained on."""
    fingerprint: str | None = None
    images: Count | None = None
    train_images: Count | None = None
    val_images: Count | None = None
    root: str | None = None


class Host(_Record):
    """The machine of rank 0."""
    hostname: str | None = None
    usable_cores: Positive | None = None
    logical_cores: Positive | None = None
    ram_bytes: Count | None = None
    gpus: list[Any] = []
    free_page_reporting: dict[str, int] | None = None
    """A VM whose virtio balloon hands free memory back to its hypervisor: ``order``, the
    blocks it reports (2^order pages; -1 not said). null: a real machine, or no such
    balloon (a large tensor freed and made again is faulted in again, here at the host's
    cost too)."""


class Launch(_Record):
    """How it was started."""
    launcher: str | None = None
    world: Positive = 1
    slurm: dict[str, Any] | None = None  # srun: its job, step and nodes


class HostLoad(_Record):
    """What other processes used of the host while it ran."""
    noisy: bool | None = None  # None: not sampled
    others_cores: dict[str, Annotated[float, After(finite)]] = {}
    threshold_cores: Annotated[float, After(finite)] | None = None


class TimeToTarget(_Record):
    target: Fraction | None = None
    reached: bool | None = None  # None: no target was set
    epoch: Positive | None = None
    seconds: Seconds | None = None
    metric: str | None = None  # [train] target_metric where not the validation accuracy


class InitWeights(_Record):
    """The weights file the run started from (--init-weights), and its sha256 then."""
    file: Text
    sha256: Sha256


class ModelBlock(_Record):
    """The network the run trained, as it was built."""
    name: str | None = None
    kind: str | None = None
    width: Annotated[float, Field(gt=0), After(finite)] | None = None
    parameters: Count | None = None
    buffers: Count | None = None
    file: Text | None = None
    sha256: Sha256 | None = None
    init_weights: InitWeights | None = None


class StudyRef(_Record):
    name: Name  # a folder's name, and a tag MLflow's filters quote
    cell: str | None = None
    repeat: Count = 0


class TrainRecord(_Record):
    """The use case's [train] table as the run used it."""
    epochs: Positive | None = None
    batch_size: Positive | None = None
    image_size: Positive | None = None
    lr: Rate | None = None
    target_accuracy: Fraction | None = None


class UseCaseRecord(_Record):
    """The use case as the run read it (checked in full when the run is replayed)."""
    name: str | None = None
    train: TrainRecord | None = None


def _option_type(f: dataclasses.Field) -> Any:
    if f.metadata["parse"] == "layers":
        return list[int]
    return {Path: str, bool: bool, int: int,
            float: Annotated[float, After(finite)]}.get(f.metadata["type"], str)


Config = create_model(
    "Config", __base__=_Record, __doc__="The run's options, each of the type its declaration "
    "gives (``config.fields.option``; its names and bounds are checked again when the run "
    "is replayed or resumed).", usecase=(UseCaseRecord, ...),
    **{f.name: (_option_type(f) | None, None) for f in options()})


class Effective(_Record):
    """What the options came to: the global batch, the learning rate."""
    global_batch: Positive | None = None
    lr: Rate | None = None


class Manifest(_Record):
    """A run's manifest.json: what ran, where, and what it measured."""
    schema_: Annotated[int, Field(ge=1, le=SCHEMA_VERSION)] = Field(1, alias="schema")
    id: Name
    status: Literal["running", "completed", "failed", "interrupted"]
    started_at: str
    ended_at: str | None = None
    exit_code: int | None = None
    error: str | None = None
    pid: Pid | None = None  # the process that ran it (``run --resume`` checks it ended)
    usecase: Text = "?"  # always written; a hand-made manifest without one is shown as "?"
    config: Config  # type: ignore[valid-type]
    effective: Effective | None = None
    strategy: StrategyBlock
    backend: BackendBlock = BackendBlock(name="local")
    data: Data = Data()
    host: Host = Host()
    launch: Launch = Launch()
    host_load: HostLoad | None = None
    versions: dict[str, str | None] = {}
    git: dict[str, Any] | None = None
    model: ModelBlock | None = None
    study: StudyRef | None = None
    epochs: list[Epoch]
    summary: Summary | None = None
    time_to_target: TimeToTarget | None = None
    val_confusion: dict[str, Any] | None = None  # the last epoch's: counts[true][predicted]
    first_step_s: Seconds | None = None
    """Seconds from the command to rank 0's first training step (where they went: startup)."""
    startup: phases.Startup | None = None


class CellFlags(_Record):
    """The cell's ``ddlstudy run`` flags (those the report reads are typed here; the plan's
    checks typed them all when the study was planned)."""
    model: Text | None = None
    precision: Text = "fp32"
    scaling: Text = "strong"


class Cell(_Record):
    """One cell of a study: a use case and flags, one repeat."""
    id: str
    usecase: Text
    label: str  # what the report calls its configuration
    strategy: Text
    backend: Text = "local"
    nodes: Positive = 1
    cores: Count = 0
    flags: CellFlags = CellFlags()
    repeat: Count = 0
    status: Text
    reason: str = ""
    run: Name | Literal[""] | None = None  # "": not run yet
    seconds: Seconds | None = None


class Study(_Record):
    """A study's study.json: its cells and where each stands."""
    name: Name
    plan: str | None = None
    repeat: Positive = 1
    started_at: str | None = None
    cells: list[Cell]


FORMATS: dict[str, type[_Record]] = {"manifest.json": Manifest, "study.json": Study,
                                     "advise.json": Advice, "advice-check.json": AdviceCheck}


def check(doc: Any, model: type[_Record], path: Path | str, what: str) -> dict[str, Any]:
    """``doc`` if it is a valid ``model``, else BadFile naming the field."""
    a = f"{'an' if what[:1].lower() in 'aeiou' else 'a'} {what}"
    if not isinstance(doc, dict):
        raise BadFile(what, path, f"is not {a} (a JSON object was expected, not "
                      f"{type(doc).__name__})")
    try:
        model.model_validate(doc)
    except ValidationError as exc:
        raise BadFile(what, path, f"{': '.join(schema_problem(exc))}; is it {a} ddlstudy "
                      "wrote, and complete?") from None
    return doc


def load(path: Path | str, model: type[_Record], what: str,
         cap: int = CAPS["record"]) -> dict[str, Any]:
    """A JSON file through the gate (``ddlstudy.reading``), checked against ``model``."""
    return check(read_json(path, what, cap), model, path, what)


def reference() -> str:
    """The formats' reference (markdown), generated from the models' JSON schemas."""
    lines = ["# File formats", "",
             "Generated from `ddlstudy/records/formats.py` (`python -m ddlstudy.records.formats`); "
             "every reader checks these. Fields not listed are kept as they are; a listed one of "
             "another type, out of its range or missing where required is refused, naming "
             "the file and the field.", ""]
    for name, model in FORMATS.items():
        schema = model.model_json_schema()
        lines += [f"## {name}", "", (model.__doc__ or "").strip().replace("``", "`"), "",
                  "| field | type | required | meaning |", "|---|---|---|---|"]
        lines += field_rows(schema, schema.get("$defs", {}), "")
        lines.append("")
    return "\n".join(lines + sampler.samples_reference())


if __name__ == "__main__":
    print(reference())
