"""``advise --memory``: every candidate's peak resident memory a node, predicted before it
is probed from the sequential baseline's probe (probed first).

The baseline's one process peaks at its ``rest`` (the interpreter, torch, the data and
the loaders: resident once set up, less its parameters and buffers), its model
(parameters, buffers and gradients, counted), its optimizer state (counted) and its
``activations`` (what its steps added beyond those: the batch's activations and the
step's transients). A node of another layout holds (its strategy's ``Footprint``) the
rest once a process, the model and optimizer state as many times as it keeps copies
(a Linear pair split over T processes counts 1/T a copy), and the activations of its
node's batch (strong scaling over N nodes: 1/N of the batch) as many times as it computes
them at once. What --memory is held to is the node's ``need``: those peaks summed, less the
files' pages (torch's libraries) every process but one counts again, which the node's
memory holds once (a host's memory cgroup charges them once). A strategy whose snapshot's
writer gathers the whole model or optimizer state (``Footprint.gathers``) peaks, after an
epoch, at its training memory less the activations plus what it gathers, where that is
more: a run writes a snapshot after every epoch, though a probe writes none.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ddlstudy.config import PROBE_SECONDS, REFAULT_PROBE_SECONDS, ModelSpec
from ddlstudy.models import shapes_only
from ddlstudy.records.memory import files_bytes
from ddlstudy.strategies.base import Footprint
from ddlstudy.training.memory import MMAP_MOST, on_glibc
from ddlstudy.training.sharding import linear_pairs


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


@dataclass(frozen=True)
class Split:
    """The baseline probe's peak in parts (bytes), and what it computed them on."""

    rest: int
    model: int
    states: int
    activations: int
    batch: int
    linear: float = 0.0
    """The share of the parameters in pairs of consecutive Linear layers (what tensor
    parallelism splits)."""
    shared: int = 0
    """Of ``rest``, the files' pages (torch's libraries): a node's processes share them,
    and its memory holds them once."""
    parameters: int = 0
    """Of ``model``, the parameters (what a snapshot's writer gathers of it)."""

    def record(self) -> dict[str, Any]:
        return asdict(self)


def split(memory: dict[str, Any], batch: int, linear: float = 0.0) -> Split | None:
    """The baseline's probe's memory in parts, from its manifest's ``backend.memory``
    (None where it did not record what set-up held)."""
    rank = next(iter(memory.get("per_rank") or []), None)
    if not rank or rank.get("setup_rss_bytes") is None:
        return None
    held, peak, setup = rank["held_bytes"], rank["peak_rss_bytes"], rank["setup_rss_bytes"]
    model = held["parameters"] + held["buffers"] + held["gradients"]
    static = held["parameters"] + held["buffers"]
    files = files_bytes(rank)  # those it mapped while training are a process's, not a batch's
    later = files - (rank.get("setup_file_bytes") or 0)
    return Split(rest=max(setup - static + later, 0), model=model,
                 states=held["optimizer_state"],
                 activations=max(peak - setup - later - held["gradients"]
                                 - held["optimizer_state"], 0), batch=batch, linear=linear,
                 shared=files, parameters=held["parameters"])


def linear_share(spec: ModelSpec, classes: int) -> float:
    """The share of the model's parameters in its pairs of consecutive Linear layers."""
    model, _ = shapes_only(spec, classes)
    names = {name for pair in linear_pairs(spec, classes) for name in pair}
    total = sum(p.numel() for p in model.parameters())
    inside = sum(p.numel() for name, m in model.named_modules() if name in names
                 for p in m.parameters())
    return inside / total if total else 0.0


def _parts(fp: Footprint, base: Split, node_batch: int) -> tuple[float, float, float]:
    """A node's peak while training, its activations' part of it, and what its snapshot's
    writer gathers beside its shards (bytes)."""
    split_share = (1 - base.linear) + base.linear / fp.tensor
    activations = fp.activations * base.activations * node_batch / base.batch
    training = (fp.processes * base.rest + fp.models * split_share * base.model
                + fp.states * split_share * base.states + activations)
    gathered = fp.gathers[0] * base.parameters + fp.gathers[1] * base.states
    return training, activations, gathered


def predict(fp: Footprint, base: Split, node_batch: int) -> int:
    """A node's predicted peak bytes: ``fp``'s copies of the baseline's parts, its
    activations for ``node_batch`` images; or, where more, as its snapshot is written (the
    activations freed, the writer's gathered copies held)."""
    training, activations, gathered = _parts(fp, base, node_batch)
    return round(max(training, training - activations + gathered))


def snapshot_more(fp: Footprint, base: Split, node_batch: int) -> int:
    """What writing a snapshot adds to a node's peak and to its writer's (bytes): what its
    writer gathers, whole (a probe's measured peaks leave it out, a probe writing none).
    Measured, a run's peaks less its probe's: tensor on tiny-full, its node +665 MiB and
    rank 0 +532 for 671 gathered; on tiny, +75 and +44 for 27 (the writer's copies and
    the other rank's sends); so none of the activations freed meanwhile is counted off."""
    return round(_parts(fp, base, node_batch)[2])


def need(fp: Footprint, base: Split, node_batch: int) -> int:
    """What a node needs of its memory, as ``records.memory.node_bytes`` measures it:
    ``predict``'s peaks of its processes, less the files' pages each maps (torch's
    libraries: the machine holds them once, and a node's memory cgroup is not charged for
    pages already cached), plus the shared memory the node holds once
    (``fp.shared_bytes``)."""
    return predict(fp, base, node_batch) - fp.processes * base.shared + fp.shared_bytes


def process_peak(fp: Footprint, base: Split, node_batch: int) -> int:
    """The predicted peak of a node's largest process (resident, the libraries' pages
    included, as ``peak_process_bytes`` measures it): one process's ``rest``, an even
    share of what the node holds over its processes (one process of a pipeline's uneven
    stages holds more: its row says so), and the whole of the node's shared memory, which
    every process maps and touches."""
    training, activations, gathered = _parts(fp, base, node_batch)
    held = training - fp.processes * base.rest
    process = base.rest + held / fp.processes + fp.shared_bytes
    return round(max(process, process - activations / fp.processes + gathered))


def refaults(largest: int, reporting: dict[str, int] | None, heap: str | None
             ) -> dict[str, int] | None:
    """Whether this host makes a run's images/s vary from its probe's: on a VM whose
    balloon hands freed memory back to its hypervisor (``reporting``: the host's
    ``free_page_reporting``), a model whose largest weight (``largest``: bytes) is over
    glibc's largest mmap threshold has that weight's gradient and an optimizer's
    temporaries mapped and faulted in afresh every step (``--heap return``), and a step
    that faults on pages the host took back runs up to twice as long: every fourth or
    fifth of tiny-full's (0.7-0.9 s against 0.38), more in some runs than in others, so
    that its probes erred by -32 to +32 % on runs of the same evening. None where that
    does not apply (or where glibc is not the allocator: ``--heap`` changes nothing)."""
    if reporting is None or heap == "keep" or largest < MMAP_MOST or not on_glibc():
        return None
    return {"largest_bytes": largest, "order": reporting.get("order", -1)}


def probe_box(box: float | None, found: dict[str, int] | None) -> float:
    """advise's time box: ``box`` where one is given (--probe-seconds), else
    REFAULT_PROBE_SECONDS where ``refaults`` found that this host varies a run's steps
    (``found``), else PROBE_SECONDS."""
    if box is not None:
        return box
    return REFAULT_PROBE_SECONDS if found is not None else PROBE_SECONDS


def refault_note(found: dict[str, int] | None) -> list[str]:
    """``refaults``'s finding in a sentence, for the advice and its check (none where
    there is none)."""
    return [] if found is None else [(
            f"this host hands freed memory back to its hypervisor every 2 s (its virtio "
            f"balloon's free page reporting), and the model's largest weight, "
            f"{found['largest_bytes'] / 2**20:.0f} MiB, is at or over glibc's "
            f"{MMAP_MOST >> 20} MiB: its gradient is mapped and faulted in afresh every "
            "step, and a step that faults on pages the host took back runs up to twice as "
            "long, more in some runs than in others. advise's probes time "
            f"{REFAULT_PROBE_SECONDS:g} s of steps each here by default (not "
            f"{PROBE_SECONDS:g}), so that each holds several of those periods, but expect a "
            "run's images/s to differ from its row by up to 15 % either way; "
            "--heap keep keeps those blocks and steadies the steps once its heap has settled "
            "(tiny-full: 5-13 %), but a kept heap's peak varies from run to run by up to a "
            "half (tiny-full's sequential: 1.6-2.5 GiB), more under FSDP's gathers")]
