"""`ddlstudy doctor`: what this machine offers the study, each missing piece with its fix."""

from __future__ import annotations

from ddlstudy.backends.mpi.launch import find_mpiexec
from ddlstudy.machine import environment
from ddlstudy.machine.sampler import NOISY_CORES, host_busy


def checks() -> list[tuple[str, bool, str, str]]:
    """(what, ok, found, fix) rows."""
    import torch

    host = environment.host()
    versions = environment.versions()
    rows = [
        ("cores", True, f"{host['usable_cores']} usable ({host['physical_cores']} physical, "
         f"{host['logical_cores']} logical), {host['cpu_model']}", ""),
        ("memory", True, f"{host['ram_bytes'] / 2**30:.1f} GiB", ""),
        ("torch", True, f"{torch.__version__}, {torch.get_num_threads()} intra-op threads, "
         f"{torch.get_num_interop_threads()} inter-op", ""),
    ]
    gpus = host["gpus"]
    rows.append(("GPUs", bool(gpus), ", ".join(g["name"] for g in gpus) or "none",
                 "" if gpus else "gpu-data and GPU pipeline stages need CUDA devices; CPU "
                 "strategies work without"))
    mpiexec = find_mpiexec()
    version = environment.first_line([mpiexec, "--version"], "Version") if mpiexec else None
    rows.append(("mpiexec", bool(version), f"{mpiexec} ({version})" if version else "not found",
                 "" if version else "pip install mpich mpi4py (make demo does) or load your "
                 "cluster's MPI module"))
    rows.append(("mpi4py", versions["mpi4py"] is not None, versions["mpi4py"] or "not installed",
                 "" if versions["mpi4py"] else "pip install mpi4py"))
    java_version = environment.java_version()
    rows.append(("java", bool(java_version), java_version or "not found",
                 "" if java_version else "install Java 17 (apt-get install openjdk-17-jre-headless)"
                 " or set JAVA_HOME"))
    rows.append(("pyspark", versions["pyspark"] is not None, versions["pyspark"] or "missing",
                 "" if versions["pyspark"] else "pip install pyspark"))
    busy = host_busy(1.0)
    quiet = busy <= NOISY_CORES
    rows.append(("load", quiet, f"other processes use {busy:.2f} core(s) now "
                 f"({'quiet' if quiet else 'busy'}: runs above {NOISY_CORES} are marked noisy)",
                 "" if quiet else "stop them before measuring, or ddlstudy study "
                 "--wait-quiet waits for them"))
    return rows


def doctor() -> int:
    for what, ok, found, fix in checks():
        print(f"{'ok ' if ok else '-- '} {what:9s} {found}")
        if fix:
            print(f"    {'':9s} fix: {fix}")
    return 0
