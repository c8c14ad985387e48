"""A Slurm batch script as ddlstudy writes it, every value rendered into its lines by one
class (``Script``): quoted for the shell (``shlex.quote``), escaped in a comment, or refused
where a line cannot hold it.

A value a plan or a flag gives (a use case's path, the study's name, the runs folder, an
``--sbatch-arg``) can hold anything a file name or a TOML string can: a newline written as
it is would end its line, and what follows would run as a command in the job (and ``#SBATCH``
lines after it would be ignored). Quoted, a newline is data on a command line; an
``#SBATCH`` line cannot hold one at all, so such a value is refused there, before anything
is written.

A cell's script continues its run where Slurm runs it again (``scontrol requeue``, a
partition's ``PreemptMode=REQUEUE``, a node that failed: ``--requeue``): from its snapshot
with ``run --resume``, or, requeued before its first snapshot, from the start, the first
attempt's folder kept aside in ``slurm/``. With a warning before the time limit
(``--signal=B:USR1@S``), the batch shell, which Slurm signals, creates the run's stop file
(``DDLSTUDY_STOP_FILE``): the run writes its snapshot at its next step and ends with
``STOPPED_CODE``, and the script asks Slurm to requeue the job.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ddlstudy.errors import UsageError
from ddlstudy.hosts.slurm import slurm_call
from ddlstudy.signals import STOP_ENV, STOPPED_CODE

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
"""What no line of a script may hold as it is: a newline ends the line, a NUL its text."""
WARNING = "USR1"
"""The signal Slurm sends the batch shell before the time limit (``--warn-before``)."""


def one_line(value: object, what: str) -> str:
    """``value`` as text, refused (UsageError, naming ``what``) where it holds a newline or
    another control character."""
    text = str(value)
    found = CONTROL.search(text)
    if found:
        raise UsageError(f"{what} {text!r} holds {found.group()!r}, which a batch script's "
                         "line cannot hold (a newline would end it, and the rest would run "
                         "as a command in the job); give it without")
    return text


def quote(value: object, what: str = "a value") -> str:
    """``value`` as one word of a shell command: quoted, a newline in it is data (a NUL,
    which no argument can hold, is refused)."""
    text = str(value)
    if "\0" in text:
        raise UsageError(f"{what} {text!r} holds a NUL character, which no command can take")
    return shlex.quote(text)


def output_path(path: Path, what: str = "the runs folder") -> str:
    """A folder for ``--output``, whose ``%`` Slurm would read as a pattern (``%j``):
    written ``%%``."""
    return one_line(path, what).replace("%", "%%")


class Script:
    """A batch script built line by line: a comment saying what it runs, its ``#SBATCH``
    options, then its shell lines, each value in them quoted."""

    def __init__(self, about: str) -> None:
        self.head = ["#!/bin/bash", "# " + CONTROL.sub(lambda m: repr(m.group())[1:-1], about)]
        self.options: list[str] = []
        self.body: list[str] = []

    def sbatch(self, *options: str, what: str = "an #SBATCH option") -> None:
        """``#SBATCH`` lines, one an option (quoted: sbatch reads them as the shell would)."""
        self.options += [f"#SBATCH {quote(one_line(o, what), what)}" for o in options]

    def export(self, name: str, value: object) -> None:
        self.line(f"export {name}={{}}", value)

    def command(self, *argv: object) -> None:
        """A command line of ``argv``, each word quoted."""
        self.body.append(" ".join(quote(a) for a in argv))

    def launch(self, *argv: object, background: bool = False) -> None:
        """``argv "$@"``: a command given the arguments ``set --`` left (in the background:
        ``&``)."""
        self.body.append(" ".join(quote(a) for a in argv) + ' "$@"' +
                         (" &" if background else ""))

    def line(self, template: str, *values: object) -> None:
        """One of ddlstudy's own shell lines, ``template`` with ``{}`` standing for each of
        ``values``, quoted."""
        self.body.append(template.format(*(quote(v) for v in values)))

    def text(self) -> str:
        return "\n".join([*self.head, *self.options, "", *self.body, ""])


def continued(script: Script, run_dir: Path, attempts: Path) -> None:
    """The lines that make a requeued job continue its run (the arguments ``"$@"`` hold the
    cell's ``ddlstudy run``): from the snapshot in ``run_dir``, or, none written yet, from
    the start, the earlier attempt's folder moved to ``attempts``."""
    script.line("run={}", run_dir)
    script.line('if [ -e "$run/snapshot.pt" ]; then  # requeued: continue from its snapshot')
    script.line('    set -- run --quiet --resume "$run"')
    script.line('elif [ -e "$run" ]; then  # requeued before its first snapshot: start again')
    script.line('    mv "$run" {}"${{SLURM_RESTART_COUNT:-0}}"', f"{attempts}.attempt-")
    script.line("fi")


def warned(script: Script, launch: list[str], stop_file: Path) -> None:
    """The lines that run ``launch "$@"`` heeding Slurm's warning: the batch shell creates
    the run's stop file on ``WARNING``, and, the run stopped at a snapshot
    (``STOPPED_CODE``), asks Slurm to requeue the job."""
    script.export(STOP_ENV, stop_file)
    script.line(f'rm -f "${STOP_ENV}"')
    script.line(f"trap 'touch \"${STOP_ENV}\"' {WARNING}  # Slurm's warning before the time "
                "limit")
    script.launch(*launch, background=True)
    script.line("wait $!; code=$?")
    script.line("while kill -0 $! 2>/dev/null; do wait $!; code=$?; done  # the warning "
                "interrupted the wait")
    script.line(f'if [ "$code" = {STOPPED_CODE} ]; then  # stopped at its snapshot: run it '
                "again from there")
    # a task of an array by its array's name: its own SLURM_JOB_ID may be the array's ID,
    # which names every task (finished ones too, which would run again)
    script.line('    job="$SLURM_JOB_ID"')
    script.line('    [ -z "$SLURM_ARRAY_JOB_ID" ] || job="${{SLURM_ARRAY_JOB_ID}}_'
                '${{SLURM_ARRAY_TASK_ID}}"')
    script.line('    scontrol requeue "$job"')
    script.line("fi")
    script.line('exit "$code"')


@dataclass(frozen=True)
class Sbatch:
    """What the user asks of every job: --partition, --account, --time, --sbatch-arg, and
    --warn-before (seconds before the time limit that Slurm warns the job)."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    args: tuple[str, ...] = ()
    warn_before: int | None = None

    def __post_init__(self) -> None:
        """Each option is one #SBATCH line: one holding a newline would end it, and the
        rest would run as a command in every job."""
        given = [(f"--{k}", v) for k, v in (("partition", self.partition),
                                           ("account", self.account), ("time", self.time))
                 if v is not None] + [("--sbatch-arg", a) for a in self.args]
        for flag, value in given:
            one_line(value, flag)
        if self.warn_before is not None and not 1 <= self.warn_before <= 65535:
            raise UsageError(f"--warn-before {self.warn_before}: give the seconds before the "
                             "time limit, from 1 to 65535 (Slurm's --signal range)")

    def lines(self) -> list[str]:
        named = [f"--{k}={v}" for k, v in (("partition", self.partition),
                                           ("account", self.account), ("time", self.time))
                 if v]
        return [*named, *self.args]


def job_options(sbatch: Sbatch) -> list[str]:
    """What every job of the study asks besides its size: its log kept when it runs
    again, requeued (a snapshot continues it), warned before its time limit where
    ``--warn-before`` says, and the user's options."""
    warn = [f"--signal=B:{WARNING}@{sbatch.warn_before}"] if sbatch.warn_before else []
    return ["--open-mode=append", "--requeue", *warn, *sbatch.lines()]


def ask_controller(sbatch: Sbatch) -> None:
    """Ask the controller whether it takes the jobs' options (``sbatch --test-only``, which
    submits nothing): refused in one line, before anything is written, where it does not
    (a partition it lacks, an option sbatch does not know, a time it cannot read)."""
    options = job_options(sbatch)
    out = slurm_call("sbatch", "--test-only", *options, input="#!/bin/sh\ntrue\n",
                     check=False)
    if out.returncode != 0:
        said = next((line for line in out.stderr.splitlines() if line.strip()), "no output")
        user = sbatch.lines() or options
        raise UsageError(f"--submit slurm: Slurm refuses the jobs' options ({' '.join(user)}):"
                         f" {said.removeprefix('sbatch: ').removeprefix('error: ')}")
