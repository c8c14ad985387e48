"""Bringing the hosts up and down: a network namespace per host, its veth link to the
bridge (shaped by tc), its CPU share (a cgroup), the launcher that enters it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from ddlstudy.errors import ConfigError, Unavailable, UsageError
from ddlstudy.hosts import cgroups, state
from ddlstudy.hosts.processes import _ip, _kill, _namespaces
from ddlstudy.hosts.slurm import slurm_down
from ddlstudy.hosts.spark import spark_down, spark_secret_file
from ddlstudy.hosts.spec import (
    DEFAULT_PREFIX,
    DEFAULT_SUBNET,
    Hosts,
    _state_file,
    rate_bits,
    validate,
)

ETC_NETNS = Path("/etc/netns")


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


def health(prefix: str = DEFAULT_PREFIX) -> tuple[Hosts | None, str]:
    """The emulated hosts ``hosts up`` made under ``prefix`` and what is wrong with them,
    in words with the command that mends it ('' where every one is there): none recorded,
    recorded but not fully made, or gone since. `hosts status` prints it; a run refuses."""
    made = state.read(prefix)
    if made is None:
        return None, (f"no emulated hosts named {prefix!r} are up; start them with: "
                      f"ddlstudy hosts up --count N --prefix {prefix}")
    hosts = made.hosts
    again = (f"run: ddlstudy hosts down --prefix {prefix} && "
             f"ddlstudy hosts up --count {hosts.count} --prefix {prefix}")
    if not made.complete:
        return hosts, (f"emulated hosts {prefix!r} were not fully made (an interrupted "
                       f"hosts up, or a failed hosts down); {again}")
    missing = [n for n in hosts.names if n not in _namespaces()]
    if missing:
        return hosts, (f"emulated host(s) {', '.join(missing)} of {prefix!r} are gone (a "
                       f"reboot?); {again}")
    return hosts, ""


def load(prefix: str = DEFAULT_PREFIX, flag: str | None = "--hosts") -> Hosts:
    """The emulated hosts ``hosts up`` made, checked to be still there: else a refusal
    naming ``flag`` (the option that named them; None: a command that has none)."""
    hosts, problem = health(prefix)
    if problem:
        raise ConfigError(flag, problem) if flag else UsageError(problem)
    return hosts


def up(count: int, prefix: str = DEFAULT_PREFIX, subnet: str = DEFAULT_SUBNET,
       delay: str | None = None, rate: str | None = None,
       cpus: list[float] | None = None, memory: int | None = None) -> Hosts:
    """Create ``count`` hosts (replacing a set of the same prefix that ddlstudy made),
    recording each thing as it is made so that ``down`` can undo even a half-made set."""
    validate(count, prefix, subnet, delay, rate, cpus, memory)
    why = can_emulate()
    if why:
        raise Unavailable("hosts", why)
    hosts = Hosts(prefix, count, subnet, delay, rate, cpus, memory)
    down(prefix)
    _refuse_foreign(hosts)
    _refuse_subnet_in_use(hosts)
    made = state.State(hosts)
    state.write(made)
    try:
        _build(hosts, made)
        made.complete = True
        state.write(made)
    except Unavailable:
        down(prefix)
        raise
    except subprocess.CalledProcessError as exc:
        down(prefix)
        raise Unavailable("hosts", f"{' '.join(exc.cmd)} failed: {exc.stderr.strip()}") \
            from None
    except OSError as exc:
        down(prefix)
        raise Unavailable("hosts", f"{exc.filename or 'hosts up'}: {exc.strerror}") from None
    return hosts


def _refuse_foreign(hosts: Hosts) -> None:
    """Refuse names ``up`` would make that exist already: ``down`` has just removed all
    that ddlstudy's record lists, so these are someone else's, never to be adopted (and
    later deleted) as the set's own."""
    taken = [n for n in hosts.names if n in _namespaces()]
    taken += [link for link in (hosts.bridge, *hosts.veths) if _link_exists(link)]
    taken += [str(ETC_NETNS / n) for n in hosts.names if os.path.lexists(ETC_NETNS / n)]
    taken += [str(g) for n in hosts.names for g in _groups(hosts, n) if g.exists()]
    if taken:
        raise ConfigError("--prefix", f"{', '.join(taken)} already exist(s) and ddlstudy did "
                          f"not make them (they are not in {_state_file(hosts.prefix)}); "
                          "choose another --prefix, or remove them yourself if they are yours")


def _refuse_subnet_in_use(hosts: Hosts) -> None:
    """Refuse a subnet whose gateway address this machine has already (another set's
    bridge, or an interface of its own): two bridges with one address route neither."""
    fields = [line.split() for line in _ip("-o", "-4", "addr", "show",
                                           check=False).stdout.splitlines()]
    have = {f[3].split("/")[0]: f[1] for f in fields if len(f) > 3}
    if hosts.gateway not in have:
        return
    users = [p for p in state.prefixes() if p != hosts.prefix
             and (made := state.read(p)) is not None and made.hosts.subnet == hosts.subnet]
    free = next((f"10.{i}.0" for i in range(77, 256) if f"10.{i}.0.254" not in have), None)
    raise ConfigError("--subnet", f"{hosts.subnet} is in use here ("
                      + (f"by the emulated hosts {users[0]!r}" if users else
                         f"{hosts.gateway} is on {have[hosts.gateway]}")
                      + (f"); give another, e.g. --subnet {free}" if free else
                         "); give another 10.x.y"))


def _link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def _build(hosts: Hosts, made: state.State) -> None:
    """The bridge, then each host on it, its shaping, its CPU share, the launcher."""
    _ip("link", "add", hosts.bridge, "type", "bridge")
    made.record("bridges", hosts.bridge)
    _ip("addr", "add", f"{hosts.gateway}/24", "dev", hosts.bridge)
    _ip("link", "set", hosts.bridge, "up")
    for name, address, veth in zip(hosts.names, hosts.addresses, hosts.veths, strict=True):
        _ip("netns", "add", name)
        made.record("namespaces", name)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
        made.record("veths", veth)
        _ip("link", "set", veth, "master", hosts.bridge, "up")
        _ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", name, "link", "set", "eth0", "up")
        _ip("-n", name, "link", "set", "lo", "up")
        # ip netns exec bind-mounts /etc/netns/<name>/* over /etc: each host resolves
        # its own name and the others' (gloo and Spark look their host name up).
        etc = ETC_NETNS / name
        etc.mkdir(parents=True)
        made.record("etc", name)
        (etc / "hosts").write_text(
            "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in hosts.members)
            + f"{hosts.gateway} {hosts.prefix}-gw\n")
    _shape(hosts)
    for name, cores in zip(hosts.names, hosts.cpus or [], strict=False):
        cgroups.limit_cpu(name, cores, made)
    for name in hosts.names if hosts.memory else []:
        cgroups.limit_memory(name, hosts.memory, made)
    _write_launcher(hosts)
    made.record("files", str(hosts.launcher))


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
                                  (["tc"], hosts.veths[i - 1], tbf)):
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


def _write_launcher(hosts: Hosts) -> None:
    """The script hydra calls instead of ssh: ``launcher [-x ...] host command...``."""
    def enter(name: str) -> str:  # join the host's cgroups (CPU share, memory), if any
        return "".join(f" echo $$ > {g}/cgroup.procs || exit 255;"  # no limit unnoticed
                       for g in _groups(hosts, name))

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


def _groups(hosts: Hosts, name: str) -> list[Path]:
    return cgroups.groups(name, bool(hosts.cpus), bool(hosts.memory))


def down(prefix: str = DEFAULT_PREFIX) -> bool:
    """Remove what ``hosts up`` recorded as made for ``prefix``, and whatever still runs in
    it; nothing found by name alone. False if ddlstudy made no such set (no record)."""
    made = state.read(prefix)
    if made is None:
        return False
    made.complete = False
    state.write(made)
    spark_down(prefix)
    slurm_down(prefix)
    _kill(made.made["namespaces"], signal.SIGKILL)
    for kind in state.KINDS:
        made.made[kind] = [name for name in made.made[kind] if not _remove(kind, name)]
        state.write(made)
    left = [name for kind in state.KINDS for name in made.made[kind]]
    if left:
        raise UsageError(f"could not remove {', '.join(left)} (still in use?); they stay "
                         f"listed in {made.path}: stop what uses them, then run: "
                         f"ddlstudy hosts down --prefix {prefix}")
    shutil.rmtree(spark_secret_file(prefix).parent, ignore_errors=True)  # its secret, logs
    state.forget(prefix)
    return True


def _remove(kind: str, name: str) -> bool:
    """Delete one thing ``up`` made; whether it is gone."""
    if kind == "namespaces":
        _ip("netns", "del", name, check=False)
        return name not in _namespaces()
    if kind in ("veths", "bridges"):
        _ip("link", "del", name, check=False)
        return not _link_exists(name)
    for _ in range(20):  # a cgroup empties once its killed processes have exited
        try:
            if kind == "etc":
                shutil.rmtree(ETC_NETNS / name)
            elif kind == "cgroups":
                Path(name).rmdir()
            else:
                Path(name).unlink()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.1)
    return False
