"""Emulated hosts: several machines on one, for runs that cross a real network.

    ddlstudy hosts up --count 3 [--delay 1ms] [--rate 1gbit]
    ddlstudy run --usecase tiny --backend mpi --nodes 3 --hosts emulated
    ddlstudy hosts spark          # a Spark standalone master and one worker per host
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
``hosts down`` (or a reboot); their state is a JSON file in ``/run/ddlstudy``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ddlstudy.errors import ConfigError, Unavailable

STATE_DIR = Path(os.environ.get("DDLSTUDY_HOSTS_DIR", "/run/ddlstudy"))
DEFAULT_PREFIX = "ddl"
DEFAULT_SUBNET = "10.77.0"
SPARK_PORT = 7077
MPI_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
"""The netmod that sends between emulated hosts over TCP (UCX would use shared memory)."""
_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,5}$")
_RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit)$")
_DELAY = re.compile(r"^\d+(\.\d+)?(us|ms|s)$")


@dataclass(frozen=True)
class Hosts:
    prefix: str
    count: int
    subnet: str
    delay: str | None = None
    rate: str | None = None
    cpus: list[float] | None = None
    """CPU time each host may use, in cores (a CFS quota): unequal nodes on one machine."""

    @property
    def names(self) -> list[str]:
        return [f"{self.prefix}-h{i}" for i in range(1, self.count + 1)]

    @property
    def addresses(self) -> list[str]:
        return [f"{self.subnet}.{i}" for i in range(1, self.count + 1)]

    @property
    def members(self) -> list[tuple[str, str]]:
        """(name, address) of every host."""
        return list(zip(self.names, self.addresses, strict=True))

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge: mpiexec and the Spark driver."""
        return f"{self.subnet}.254"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br0"

    @property
    def launcher(self) -> Path:
        return STATE_DIR / f"{self.prefix}-launch"

    @property
    def spark_master(self) -> str:
        return f"spark://{self.addresses[0]}:{SPARK_PORT}"

    def mpiexec_args(self, nodes: int) -> list[str]:
        """mpiexec's flags that place ``nodes`` ranks round-robin on the hosts, started
        through the namespace launcher, with mpiexec itself on the bridge address."""
        return ["-launcher", "ssh", "-launcher-exec", str(self.launcher),
                "-localhost", self.gateway,
                "-hosts", ",".join(self.addresses[:min(nodes, self.count)])]

    def command(self, host: int, command: list[str]) -> list[str]:
        """``command`` run on host ``host`` (1-based), through the launcher as hydra does."""
        return [str(self.launcher), self.addresses[host - 1], shlex.join(command)]

    def run_on(self, host: int, command: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, command), **kwargs)


def can_emulate() -> str | None:
    """Why hosts cannot be emulated here, or None."""
    if os.name != "posix" or not Path("/proc/self/ns/net").exists():
        return "emulated hosts need Linux network namespaces"
    if os.geteuid() != 0:
        return "emulated hosts need root (ip netns add); run as root or use real hosts"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"emulated hosts need {tool!r} (Debian: apt install iproute2 util-linux)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def check_prefix(prefix: str) -> str:
    """``prefix`` if it is a set's name (it names namespaces, links, a bridge and state
    files, so nothing else may pass: no path, no other tool's interface)."""
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise ConfigError("--prefix", f"{prefix!r}; use 1-6 lower-case letters or digits, "
                          "starting with a letter (it names namespaces and a bridge)")
    return prefix


def _state_file(prefix: str) -> Path:
    return STATE_DIR / f"{check_prefix(prefix)}.json"


def validate(count: int, prefix: str, subnet: str, delay: str | None, rate: str | None,
             cpus: list[float] | None = None) -> None:
    if not 1 <= count <= 16:
        raise ConfigError("--count", f"{count} hosts; between 1 and 16 can be emulated")
    check_prefix(prefix)
    parts = subnet.split(".")
    if len(parts) != 3 or not all(p.isdigit() and 0 <= int(p) <= 255 for p in parts) \
            or parts[0] != "10":
        raise ConfigError("--subnet", f"{subnet!r}; give the first three numbers of a private "
                          "10.x.y address, e.g. 10.77.0")
    if delay is not None and not _DELAY.match(delay):
        raise ConfigError("--delay", f"{delay!r}; a tc time such as 500us, 2ms or 0.1s")
    if rate is not None and not _RATE.match(rate):
        raise ConfigError("--rate", f"{rate!r}; a tc rate such as 100mbit or 1gbit")
    if cpus is not None and (len(cpus) != count or not all(0.05 <= c <= 64 for c in cpus)):
        raise ConfigError("--cpus", f"{','.join(map(str, cpus))}; give one CPU share per host "
                          f"({count}), each from 0.05 to 64 cores, e.g. 1,0.5")


def parse_cpus(text: str | None) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(c) for c in text.split(",")]
    except ValueError:
        raise ConfigError("--cpus", f"{text!r}; give one number of cores per host, "
                          "e.g. 1,0.5") from None


def _cgroup(name: str) -> Path | None:
    """The CPU cgroup of a host (v1's cpu controller, or the unified hierarchy)."""
    root = Path("/sys/fs/cgroup")
    if (root / "cpu" / "cpu.cfs_quota_us").exists() or (root / "cpu" / "tasks").exists():
        return root / "cpu" / f"ddlstudy-{name}"
    if (root / "cgroup.controllers").exists():
        return root / f"ddlstudy-{name}"
    return None


def _limit_cpu(name: str, cores: float) -> Path:
    group = _cgroup(name)
    if group is None:
        raise Unavailable("--cpus", "no CPU cgroup here (/sys/fs/cgroup/cpu or cgroup v2), so "
                          "hosts cannot be given unequal CPU shares")
    try:
        group.mkdir(exist_ok=True)
        period = 10_000  # 10 ms: throttled in slices finer than a training step
        if (group / "cpu.cfs_quota_us").exists():
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(int(cores * period)))
        else:
            (group / "cpu.max").write_text(f"{int(cores * period)} {period}")
    except OSError as exc:
        raise Unavailable("--cpus", f"cannot set a CPU quota in {group}: {exc.strerror}") \
            from None
    return group


def load(prefix: str = DEFAULT_PREFIX) -> Hosts:
    """The emulated hosts ``hosts up`` made, checked to be still there."""
    check_prefix(prefix)
    try:
        hosts = Hosts(**json.loads(_state_file(prefix).read_text()))
    except (OSError, ValueError, TypeError):
        raise ConfigError("--hosts", f"no emulated hosts named {prefix!r} are up; start them "
                          f"with: ddlstudy hosts up --count N --prefix {prefix}") from None
    missing = [n for n in hosts.names if n not in _namespaces()]
    if missing:
        raise ConfigError("--hosts", f"emulated host(s) {', '.join(missing)} are gone (a "
                          f"reboot?); run: ddlstudy hosts down --prefix {prefix} && "
                          f"ddlstudy hosts up --count {hosts.count} --prefix {prefix}")
    return hosts


def _namespaces() -> set[str]:
    out = _ip("netns", "list", check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def up(count: int, prefix: str = DEFAULT_PREFIX, subnet: str = DEFAULT_SUBNET,
       delay: str | None = None, rate: str | None = None,
       cpus: list[float] | None = None) -> Hosts:
    """Create ``count`` hosts (replacing a set of the same prefix)."""
    validate(count, prefix, subnet, delay, rate, cpus)
    why = can_emulate()
    if why:
        raise Unavailable("hosts", why)
    hosts = Hosts(prefix, count, subnet, delay, rate, cpus)
    down(prefix)
    try:
        _ip("link", "add", hosts.bridge, "type", "bridge")
        _ip("addr", "add", f"{hosts.gateway}/24", "dev", hosts.bridge)
        _ip("link", "set", hosts.bridge, "up")
        for i, (name, address) in enumerate(hosts.members, start=1):
            veth = f"{prefix}-v{i}"
            _ip("netns", "add", name)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
            _ip("link", "set", veth, "master", hosts.bridge, "up")
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
            # ip netns exec bind-mounts /etc/netns/<name>/* over /etc: each host resolves
            # its own name and the others' (gloo and Spark look their host name up).
            etc = Path("/etc/netns") / name
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(
                "127.0.0.1 localhost\n" + "".join(
                    f"{a} {n}\n" for n, a in hosts.members)
                + f"{hosts.gateway} {prefix}-gw\n")
        _shape(hosts)
        for name, cores in zip(hosts.names, hosts.cpus or [], strict=False):
            _limit_cpu(name, cores)
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        _write_launcher(hosts)
        _state_file(prefix).write_text(json.dumps(asdict(hosts), indent=2) + "\n")
    except Unavailable:
        down(prefix)
        raise
    except subprocess.CalledProcessError as exc:
        down(prefix)
        raise Unavailable("hosts", f"{' '.join(exc.cmd)} failed: {exc.stderr.strip()}") \
            from None
    return hosts


def _shape(hosts: Hosts) -> None:
    """Shape every host's link, each direction getting the rate and delay:
    ``tbf`` for a rate alone, ``netem`` when there is a delay (kernels without netem, as
    some VMs', can still cap the rate)."""
    if hosts.delay is None and hosts.rate is None:
        return
    tbf = None
    if hosts.rate:
        # a bucket of 10 ms at the rate (at least a few full frames), queued up to 100 ms
        tbf = ["tbf", "rate", hosts.rate, "burst",
               str(max(15000, int(rate_bits(hosts.rate) / 8 / 100))), "latency", "100ms"]
    sent = ["netem", "delay", hosts.delay, *(["rate", hosts.rate] if hosts.rate else [])] \
        if hosts.delay else tbf
    # Both ends of every veth pair: the host's eth0 shapes (and delays) what it sends, the
    # bridge's port caps what it receives, as a real link caps both directions.
    for i, name in enumerate(hosts.names, start=1):
        for where, dev, qdisc in ((["ip", "netns", "exec", name, "tc"], "eth0", sent),
                                  (["tc"], f"{hosts.prefix}-v{i}", tbf)):
            if qdisc is None:
                continue
            done = subprocess.run([*where, "qdisc", "replace", "dev", dev, "root", *qdisc],
                                  capture_output=True, text=True)
            if done.returncode and qdisc[0] == "netem" and "unknown" in done.stderr:
                raise Unavailable("--delay", "this kernel has no netem qdisc "
                                  "(CONFIG_NET_SCH_NETEM), so links cannot be delayed here; "
                                  "--rate alone works (tbf)")
            if done.returncode:
                raise Unavailable("--rate" if hosts.rate else "--delay",
                                  f"tc qdisc {' '.join(qdisc)} failed: {done.stderr.strip()}")


_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def emulated_prefix(spec: str | None) -> str | None:
    """The prefix of the emulated hosts a ``--hosts`` value names (``emulated`` or
    ``emulated:PREFIX``); None for real hosts, or for none."""
    if spec is not None and (spec == "emulated" or spec.startswith("emulated:")):
        return spec.partition(":")[2] or DEFAULT_PREFIX
    return None


def rate_bits(rate: str, flag: str = "--rate") -> float:
    """A tc rate ("100mbit") in bits per second (ConfigError naming ``flag`` if not one)."""
    found = _RATE.match(rate)
    if not found:
        raise ConfigError(flag, f"{rate!r}; a tc rate such as 100mbit or 1gbit")
    return float(rate[:found.start(2)]) * _UNITS[found.group(2)]


def _write_launcher(hosts: Hosts) -> None:
    """The script hydra calls instead of ssh: ``launcher [-x ...] host command...``."""
    def enter(name: str) -> str:  # join the host's CPU cgroup, if it has one
        group = _cgroup(name) if hosts.cpus else None
        return f" echo $$ > {group}/cgroup.procs;" if group else ""

    cases = "".join(f"  {a}|{n}) ns={n};{enter(n)};\n" for n, a in hosts.members)
    script = f"""#!/bin/sh
# ddlstudy's emulated hosts ({hosts.prefix}): enter a host's namespaces and run a command.
while [ "${{1#-}}" != "$1" ]; do shift; done   # ssh options hydra passes (-x)
host="$1"; shift
case "$host" in
{cases}  *) echo "ddlstudy emulated hosts: no host $host" >&2; exit 255;;
esac
exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns && exec $*"
"""
    tmp = hosts.launcher.with_suffix(".tmp")
    tmp.write_text(script)
    tmp.chmod(0o755)
    tmp.replace(hosts.launcher)


def down(prefix: str = DEFAULT_PREFIX) -> None:
    """Remove the hosts of ``prefix`` and whatever still runs in them."""
    check_prefix(prefix)
    spark_down(prefix)
    _kill(prefix, signal.SIGKILL)
    for name in sorted(n for n in _namespaces() if n.startswith(f"{prefix}-h")):
        _ip("netns", "del", name, check=False)
        shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
    links = _ip("-o", "link", "show", check=False).stdout
    for veth in re.findall(rf"^\d+: ({re.escape(prefix)}-v\d+)@", links, re.M):
        _ip("link", "del", veth, check=False)
    _ip("link", "del", f"{prefix}br0", check=False)
    for group in Path("/sys/fs/cgroup").glob(f"**/ddlstudy-{prefix}-h*"):
        try:
            group.rmdir()  # empty once the processes above are gone
        except OSError:
            pass
    for path in (_state_file(prefix), STATE_DIR / f"{prefix}-launch"):
        path.unlink(missing_ok=True)


# -- Spark standalone on the hosts ---------------------------------------------------------

def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def spark_secret_file(prefix: str) -> Path:
    """The shared secret of the hosts' Spark daemons (``run --spark-secret-file``)."""
    return STATE_DIR / f"{check_prefix(prefix)}-spark" / "secret"


def _spark_properties(prefix: str) -> Path:
    """A new secret for the daemons, and their properties file that enables it (both
    readable by this user only: whoever holds the secret may run code on the workers)."""
    folder = spark_secret_file(prefix).parent
    folder.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(32)
    for name, text in (("secret", secret + "\n"),
                       ("spark.properties", f"spark.authenticate true\n"
                                            f"spark.authenticate.secret {secret}\n")):
        file = folder / name
        file.unlink(missing_ok=True)
        with os.fdopen(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(text)
    return folder / "spark.properties"


def spark_up(hosts: Hosts, cores: int = 1, memory: str = "2g", timeout: float = 90) -> str:
    """A master on host 1 and one worker per host, bound to the hosts' addresses and
    accepting only drivers that hold their new shared secret (``spark_secret_file``);
    returns the master URL once every worker has registered."""
    spark_down(hosts.prefix)
    logs = STATE_DIR / f"{hosts.prefix}-spark"
    properties = _spark_properties(hosts.prefix)
    env = os.environ | {"PYSPARK_PYTHON": sys.executable, "SPARK_NO_DAEMONIZE": "1"}
    master = hosts.spark_master

    def start(host: int, what: str, *args: str) -> None:
        command = [_spark_class(), what, "--host", hosts.addresses[host - 1],
                   "--properties-file", str(properties), *args]
        with open(logs / f"{what.rsplit('.', 1)[1].lower()}-h{host}.log", "w") as log:
            subprocess.Popen(hosts.command(host, command), env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)

    start(1, "org.apache.spark.deploy.master.Master", "--port", str(SPARK_PORT),
          "--webui-port", "8080")
    for host in range(1, hosts.count + 1):
        start(host, "org.apache.spark.deploy.worker.Worker", "--cores", str(cores),
              "--memory", memory, "--webui-port", "8081", master)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _registered_workers(logs) >= hosts.count:
            return master
        time.sleep(0.5)
    raise Unavailable("hosts spark", f"{hosts.count} worker(s) did not register with {master} "
                      f"within {timeout:.0f} s; see the logs in {logs}")


def _registered_workers(logs: Path) -> int:
    try:
        text = (logs / "master-h1.log").read_text()
    except OSError:
        return 0
    return text.count("Registering worker")


def spark_down(prefix: str) -> None:
    """Stop the Spark daemons on the hosts (every JVM in their namespaces)."""
    _kill(prefix, signal.SIGTERM, only="java")


def _pids(name: str) -> list[int]:
    """The processes in host ``name``'s network namespace."""
    return [int(p) for p in _ip("netns", "pids", name, check=False).stdout.split()]


def _kill(prefix: str, sig: int, only: str | None = None) -> None:
    """Send ``sig`` to every process on the hosts of ``prefix`` (whose name holds
    ``only``, if given)."""
    for name in (n for n in _namespaces() if n.startswith(f"{prefix}-h")):
        for pid in _pids(name):
            if only is None or only in _comm(pid):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass


def status(hosts: Hosts) -> str:
    """One line per host: address, link shaping, bytes each way, Spark daemons."""
    lines = []
    for name, address in hosts.members:
        counter = {what: int(subprocess.run(
            ["ip", "netns", "exec", name, "cat", f"/sys/class/net/eth0/statistics/{what}_bytes"],
            capture_output=True, text=True).stdout.strip() or 0) for what in ("tx", "rx")}

        qdisc = subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "show", "dev",
                                "eth0"], capture_output=True, text=True).stdout.split("\n")[0]
        java = sum(1 for pid in _pids(name) if "java" in _comm(pid))
        lines.append(f"{name} {address}  sent {counter['tx'] / 1e6:.1f} MB, received "
                     f"{counter['rx'] / 1e6:.1f} MB  [{qdisc.strip() or 'no qdisc'}]"
                     f"{f'  {java} Spark JVM(s)' if java else ''}")
    return "\n".join(lines)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return ""
