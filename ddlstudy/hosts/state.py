"""What ``hosts up`` made, kept in its state file: the only things ``hosts down`` deletes.

``up`` records every bridge, namespace, veth, /etc/netns folder, cgroup and file right
after making it, so a half-finished ``up`` can still be undone; ``down`` deletes what the
record lists and nothing it finds by name alone (``--prefix vir`` must never reach
libvirt's ``virbr0``, nor ``--prefix zz`` a bridge someone made by hand). The file is read
with suspicion: anything but the record ``up`` writes (not JSON, other types, names ``up``
would not make, a FIFO) is refused with how to clean up by hand, since deleting what a
damaged record names could delete what ddlstudy never made.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import ddlstudy.hosts.spec as spec
from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.hosts.spec import Hosts, _state_file, validate

KINDS = ("namespaces", "veths", "bridges", "etc", "cgroups", "files")
"""What ``up`` makes, in the order ``down`` removes it (a namespace takes its veth pair)."""
_MAX_BYTES = 1 << 20


@dataclass
class State:
    hosts: Hosts
    complete: bool = False
    """Whether ``up`` finished; a set that did not is only fit to be taken down."""
    made: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})

    @property
    def path(self) -> Path:
        return _state_file(self.hosts.prefix)

    def record(self, kind: str, name: str) -> None:
        """Note ``name`` as made, on disk at once (before ``up`` makes the next thing)."""
        self.made[kind].append(name)
        write(self)


def write(state: State) -> None:
    """Replace the state file whole (a crash leaves the old record or the new one)."""
    path = state.path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    text = json.dumps({"hosts": asdict(state.hosts), "complete": state.complete,
                       "made": state.made}, indent=2) + "\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def forget(prefix: str) -> None:
    _state_file(prefix).unlink(missing_ok=True)


def read(prefix: str) -> State | None:
    """The record of the set ``prefix``; None if ddlstudy made none (no state file)."""
    path = _state_file(prefix)
    text = _text(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or set(data) != {"hosts", "complete", "made"} \
                or not isinstance(data["complete"], bool):
            raise ValueError("not the record 'hosts up' writes")
        return State(_hosts(prefix, data["hosts"]), data["complete"],
                     _made(prefix, data["made"]))
    except RecursionError:
        raise _damaged(path, "nested too deep") from None
    except ValueError as exc:
        raise _damaged(path, str(exc).splitlines()[0] if str(exc) else "unreadable") \
            from None


def prefixes() -> list[str]:
    """The sets ddlstudy has a record of."""
    try:
        files = list(spec.state_dir().glob("*.json"))
    except OSError:
        return []
    return sorted(f.stem for f in files if spec._PREFIX.fullmatch(f.stem))


def _text(path: Path) -> str | None:
    """The file's text, without following a link or waiting on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _damaged(path, exc.strerror or "cannot be opened") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _damaged(path, "not a regular file")
        data = f.read(_MAX_BYTES + 1)
    if len(data) > _MAX_BYTES:
        raise _damaged(path, "too large")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise _damaged(path, "not UTF-8 text") from None


def _hosts(prefix: str, data: object) -> Hosts:
    """The set the record describes, every field of the type and range ``up`` allows."""
    names = {f.name for f in fields(Hosts)}
    if isinstance(data, dict):  # a record from before --memory
        data = {"memory": None} | data
    if not isinstance(data, dict) or set(data) != names or data["prefix"] != prefix:
        raise ValueError(f"'hosts' is not the set {prefix!r}")
    count, subnet, delay, rate, cpus, memory = (
        data[k] for k in ("count", "subnet", "delay", "rate", "cpus", "memory"))
    if type(count) is not int or not isinstance(subnet, str) \
            or not all(v is None or isinstance(v, str) for v in (delay, rate)) \
            or not (cpus is None or isinstance(cpus, list) and all(
                type(c) in (int, float) for c in cpus)) \
            or not (memory is None or type(memory) is int):
        raise ValueError("'hosts' has a field of the wrong type")
    try:
        validate(count, prefix, subnet, delay, rate, cpus, memory)
    except ConfigError as exc:
        raise ValueError(f"'hosts' {exc}") from None
    return Hosts(**data)


def _made(prefix: str, made: object) -> dict[str, list[str]]:
    """The record of what was made, holding only names ``up`` makes for ``prefix``."""
    if not isinstance(made, dict) or set(made) != set(KINDS):
        raise ValueError(f"'made' does not list {', '.join(KINDS)}")
    host = r"-h([1-9]|1[0-6])"
    allowed = {"namespaces": prefix + host, "veths": prefix + r"-v([1-9]|1[0-6])",
               "bridges": prefix + "br0", "etc": prefix + host,
               "cgroups": rf"/sys/fs/cgroup/(cpu/|memory/)?ddlstudy-{prefix}{host}",
               "files": re.escape(str(spec.STATE_DIR / f"{prefix}-launch"))}
    for kind, names in made.items():
        if not isinstance(names, list) or not all(
                isinstance(n, str) and re.fullmatch(allowed[kind], n) for n in names):
            raise ValueError(f"'made' lists {kind} that 'hosts up --prefix {prefix}' "
                             "does not make")
    return made


def _damaged(path: Path, why: str) -> UsageError:
    return UsageError(f"{path}: not a state file ddlstudy can trust ({why}); nothing was "
                      "changed. See what is left with `ip link` and `ip netns list`, remove "
                      f"what ddlstudy made by hand (ip link del, ip netns del), then delete "
                      f"{path}")
