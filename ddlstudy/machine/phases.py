"""The manifest's ``startup`` block (``environment.startup``), as its readers check it
(``records.formats``): apart from the functions that note the phases, so that a process
that notes them does not build its schema (pydantic reads the fields' docstrings from
the source: 60 ms a process)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from ddlstudy.config.schema import RECORDED


class Phase(BaseModel):
    """One phase of a run's start, in the process that ran it."""
    model_config = RECORDED
    process: str
    """``command`` (the user's), ``rank N`` (a process the run spawned), ``MPI rank N``."""
    phase: str
    """What ended: ``python`` (the interpreter and ddlstudy's command line), ``imports``
    (the runner, and torch in a process that trains: MPI's launcher imports none),
    ``checks`` (the run's checks: its model on the meta device), ``data`` (the data set
    scanned and split), ``folder`` (the run folder), ``MPI`` (MPI initialised), ``start``
    (a spawned process's own start, until it runs ddlstudy's code), ``group`` (its process
    group joined), ``model`` (the model built), ``setup`` (the rest, up to the first step:
    optimizer, loaders, buffers, the first batch), ``first step`` (the first training step
    itself)."""
    s: Annotated[float, Field(ge=0)]
    """Its seconds: from the end of the phase before."""
    at_s: Annotated[float, Field(ge=0)]
    """Seconds from the command to its end."""


class Collector(BaseModel):
    """Python's garbage collector over the start of rank 0's process, up to its first step
    (``machine.collector``)."""
    model_config = RECORDED
    passes: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=3, max_length=3)]
    """Its passes by generation, youngest first: the last are full passes, each over every
    object the process holds."""
    s: Annotated[float, Field(ge=0)]
    """Their seconds, in all."""


class Startup(BaseModel):
    """Where the seconds from the command to the end of rank 0's first step went."""
    model_config = RECORDED
    phases: list[Phase] = []
    collector: Collector | None = None
    """Where the process counted them (a process ddlstudy started: ``ddlstudy run``, a
    rank, an MPI rank); absent for a run called from Python and for Spark's tasks (Spark
    starts their processes)."""
