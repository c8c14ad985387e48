"""What ``ddlstudy run`` does around a launcher: refuse one that would start unrelated
copies of the run (torchrun, a bare multi-task srun), and, once the backend's own launcher
(``--backend mpi --nodes N``) has ended, close the run folder with what the launcher saw
that its ranks could not (a rank killed before it could say, the kernel's memory kills)."""

from __future__ import annotations

from pathlib import Path

from ddlstudy.backends import Backend
from ddlstudy.errors import UsageError
from ddlstudy.records.runfolder import MANIFEST, RunFolder


class RunFailed(Exception):
    def __init__(self, folder: RunFolder, exit_code: int, message: str) -> None:
        self.folder = folder
        self.exit_code = exit_code
        super().__init__(message)


def refuse_foreign_launcher(env: dict[str, str], backend: Backend) -> None:
    """torchrun and Slurm's srun start N copies of the command: outside an MPI world each
    would be a whole run of its own, in a folder of its own. Say so instead of training N
    unrelated runs (under srun, ``--backend mpi`` joins: each task is an MPI rank)."""
    world = env.get("WORLD_SIZE", "1")
    if "TORCHELASTIC_RUN_ID" in env and world.isdigit() and int(world) > 1:
        raise UsageError(f"started by torchrun as rank {env.get('RANK', '?')} of {world}: "
                         f"ddlstudy starts its own workers, so this would be {world} "
                         f"unrelated runs; run it once, without torchrun, with --strategy "
                         f"cpu-processes --workers {world} (one node) or --backend mpi "
                         f"--nodes {world}")
    tasks = env.get("SLURM_NTASKS", "1")
    if "SLURM_PROCID" in env and tasks.isdigit() and int(tasks) > 1 and \
            not backend.srun_tasks:
        raise UsageError(f"started by srun as task {env['SLURM_PROCID']} of {tasks} with "
                         f"--backend {backend.name}: that would be {tasks} unrelated runs; give "
                         f"--backend mpi (each task an MPI node: srun --mpi=pmi2 ...), or "
                         f"run it once with srun --ntasks 1")


def launched_run(ended, path: Path) -> RunFolder:
    """The run folder ``path`` the launched ranks wrote, closed with how they ended
    (``ended``: a ``backends.mpi.launch.Launched``); RunFailed where it failed."""
    code, dead_pid = ended.code, ended.dead_pid
    if not (path / MANIFEST).is_file():
        if code:
            raise UsageError(f"the launcher exited with code {code} before the run started"
                             + (f": {ended.cause}" if ended.cause else ""))
        raise UsageError("the launcher ended without writing a run folder")
    folder = RunFolder.open(path)
    if ended.hosts_memory is not None:  # what each host of a given size was charged
        backend = folder.manifest["backend"]
        backend["memory"] = backend.get("memory", {}) | {"hosts": ended.hosts_memory}
        folder.write_manifest()
    if ended.cause and folder.manifest["status"] in ("running", "failed"):
        folder.finish("failed", code or 1, ended.cause)  # over what the ranks saw of it
    elif folder.manifest["status"] == "running":  # node 0 was killed before it could say
        pids = folder.manifest["backend"].get("pids", [])
        who = f"MPI rank {pids.index(dead_pid)} (PID {dead_pid})" if dead_pid in pids \
            else "an MPI rank"
        folder.finish("failed", code or 1, ended.failure or
                      f"{who} died; mpiexec exit code {code}")
    if folder.manifest["exit_code"]:
        raise RunFailed(folder, folder.manifest["exit_code"],
                        f"run {path.name} {folder.manifest['status']}: {folder.manifest['error']}")
    return folder
