"""`ddlstudy hosts`: emulated hosts (network namespaces) for multi-host runs."""

from __future__ import annotations

import argparse

from ddlstudy.cli.common import check_positive
from ddlstudy.config.limits import size_bytes


def register(sub) -> None:
    p = sub.add_parser("hosts", help="emulated hosts (network namespaces) for multi-host runs")
    hsub = p.add_subparsers(dest="hosts_command", required=True, metavar="WHAT")
    h = hsub.add_parser("up", help="create N hosts joined by a bridge (root, iproute2)")
    h.add_argument("--count", type=int, default=2, help="hosts (default 2)")
    h.add_argument("--delay", help="one-way delay added on every host's link, e.g. 2ms "
                   "(default: none)")
    h.add_argument("--rate", help="bandwidth of every host's link, e.g. 1gbit (default: "
                   "unlimited)")
    h.add_argument("--cpus", help="CPU time per host in cores, e.g. 1,0.5 for unequal nodes "
                   "(default: unlimited)")
    h.add_argument("--memory", help="memory each host's processes may hold together, e.g. "
                   "2GiB (a cgroup's limit: past it the kernel kills one, and a run says "
                   "which; default: unlimited)")
    h.add_argument("--subnet", default="10.77.0", help="their /24 (default 10.77.0)")
    hsub.add_parser("down", help="remove the hosts and what runs on them (only what hosts up "
                    "recorded as made)")
    hsub.add_parser("status", help="the hosts that are up, their links and Spark daemons")
    h = hsub.add_parser("spark", help="a Spark standalone master on host 1 and a worker on "
                        "each")
    h.add_argument("--cores", type=int, default=1, help="task slots per worker (default 1)")
    hsub.add_parser("slurm", help="a real Slurm: munge, a slurmctld on the bridge and a slurmd "
                    "on each host, for srun --mpi=pmi2 (root, apt-get install slurm-wlm munge)")
    for h in hsub.choices.values():
        h.add_argument("--prefix", default="ddl", help="names the set (default ddl)")
    p.set_defaults(func=cmd_hosts)


def cmd_hosts(args: argparse.Namespace) -> int:
    from ddlstudy import hosts

    if args.hosts_command == "up":
        memory = size_bytes("--memory", args.memory) if args.memory is not None else None
        made = hosts.up(args.count, args.prefix, args.subnet, args.delay, args.rate,
                        hosts.parse_cpus(args.cpus), memory)
        link = ", ".join(x for x in (made.delay and f"delay {made.delay}",
                                     made.rate and f"rate {made.rate}",
                                     made.cpus and f"cpus {args.cpus}",
                                     made.memory and f"memory {args.memory} each")
                         if x) or "unshaped"
        print(f"{made.count} hosts up ({link}): "
              + ", ".join(f"{n} {a}" for n, a in made.members))
        flag = "emulated" if args.prefix == hosts.DEFAULT_PREFIX else f"emulated:{args.prefix}"
        print(f"  MPI:   ddlstudy run ... --backend mpi --nodes {made.count} --hosts {flag}")
        named = "" if flag == "emulated" else f" --prefix {args.prefix}"
        print(f"  Spark: ddlstudy hosts spark{named}, then --backend spark --spark-master "
              f"{made.spark_master} --spark-secret-file {hosts.spark_secret_file(made.prefix)}")
    elif args.hosts_command == "down":
        if hosts.down(args.prefix):
            print(f"hosts {args.prefix}-h* removed")
        else:
            print(f"no emulated hosts with prefix {args.prefix} were made by ddlstudy; "
                  "nothing deleted")
    elif args.hosts_command == "spark":
        check_positive(args, "cores")
        up = hosts.load(args.prefix, flag=None)  # spark has no --hosts to name
        master = hosts.spark_up(up, cores=args.cores)
        print(f"Spark master {master} with {up.count} worker(s) of {args.cores} core(s); "
              f"run with --backend spark --spark-master {master} --spark-secret-file "
              f"{hosts.spark_secret_file(up.prefix)}")
    elif args.hosts_command == "slurm":
        _slurm(args.prefix)
    else:
        _status(args.prefix)
    return 0


def _slurm(prefix: str) -> None:
    from ddlstudy import hosts

    hosts.require_slurm()
    up = hosts.load(prefix, flag=None)  # slurm has no --hosts to name
    conf = hosts.slurm_up(up)
    print(f"Slurm up: controller {up.prefix}-gw on {up.gateway}, partition {up.prefix}, "
          f"{up.count} idle node(s) {', '.join(up.names)}; srun and sinfo need:")
    print(f"  export SLURM_CONF={conf}")
    print(f"  srun --mpi=pmi2 -N {up.count} -n {up.count} ddlstudy run --usecase tiny "
          "--backend mpi")


def _status(prefix: str) -> None:
    """The hosts of ``prefix``; none up, or a set half made or gone, is an answer (with the
    command that mends it), not an error."""
    from ddlstudy import hosts
    from ddlstudy.hosts.namespaces import health

    made = hosts.prefixes()
    if prefix in made:
        up, problem = health(prefix)
        print(problem or "\n".join(filter(None, (hosts.status(up),
                                                  hosts.slurm_status(prefix)))))
    elif made:
        print(f"no emulated hosts are up with prefix {hosts.check_prefix(prefix)}; sets that "
              f"are: {', '.join(made)} (give --prefix)")
    else:
        hosts.check_prefix(prefix)
        print("no emulated hosts are up")
