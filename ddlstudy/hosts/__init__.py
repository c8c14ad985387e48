"""Emulated hosts: several machines on one, for runs that cross a real network.

    ddlstudy hosts up --count 3 [--delay 1ms] [--rate 1gbit]
    ddlstudy run --usecase tiny --backend mpi --nodes 3 --hosts emulated
    ddlstudy hosts spark          # a Spark standalone master and one worker per host
    ddlstudy hosts slurm          # munge, a slurmctld and one slurmd per host (Slurm)
    ddlstudy hosts down

Each host is a Linux network namespace (``<prefix>-h1``...) with one veth interface whose
other end is on a bridge in the root namespace (``<prefix>.254``, where mpiexec and the
Spark driver run). Processes enter a host through a launcher script that hydra's ssh
launcher calls in place of ssh: it enters the namespace and a UTS namespace of its own, so
the rank sees the host's name and address and no other. MPICH's default UCX netmod would
still pass messages through shared memory between "hosts" on one kernel, so runs on
emulated hosts use the OFI netmod's TCP provider: every byte crosses the veth pair, where
``tc netem`` can delay it and cap its rate, and each rank's network counters see it.

Needs root and iproute2; everything else comes from the venv. The hosts persist until
``hosts down`` (or a reboot); their state is a JSON file in ``/run/ddlstudy`` that lists
everything ``hosts up`` made, and ``hosts down`` deletes that and nothing else
(``state.py``): a bridge or namespace that merely shares the prefix is never touched.
"""

from ddlstudy.hosts.cgroups import HostMemory, MemoryWatch, out_of_memory
from ddlstudy.hosts.namespaces import can_emulate, down, load, up
from ddlstudy.hosts.slurm import (
    can_slurm,
    require_slurm,
    slurm_conf,
    slurm_down,
    slurm_status,
    slurm_up,
)
from ddlstudy.hosts.spark import spark_down, spark_secret_file, spark_up
from ddlstudy.hosts.spec import (
    DEFAULT_PREFIX,
    DEFAULT_SUBNET,
    MPI_ENV,
    SPARK_PORT,
    STATE_DIR,
    Hosts,
    check_prefix,
    emulated_prefix,
    parse_cpus,
    rate_bits,
    validate,
)
from ddlstudy.hosts.state import prefixes
from ddlstudy.hosts.status import status

__all__ = ["DEFAULT_PREFIX", "DEFAULT_SUBNET", "MPI_ENV", "SPARK_PORT", "STATE_DIR", "HostMemory",
           "Hosts", "MemoryWatch", "can_emulate", "can_slurm", "check_prefix", "down",
           "emulated_prefix", "load", "out_of_memory", "parse_cpus", "prefixes", "rate_bits",
           "require_slurm", "slurm_conf", "slurm_down", "slurm_status", "slurm_up", "spark_down",
           "spark_secret_file", "spark_up", "status", "up", "validate"]
