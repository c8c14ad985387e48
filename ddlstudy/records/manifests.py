"""`ddlstudy replay` (the same run again, from its manifest) and `ddlstudy compare` (what
differs between two runs, and by how much).

A replay rebuilds the RunConfig the manifest recorded: same use case (as recorded, not as
the TOML file reads today), flags and seeds. It warns about every package version, host
or code difference, and refuses to train when the data set's fingerprint no longer matches
the manifest's: the images changed, and the replay would silently measure something else.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

from ddlstudy.config import RunConfig, usecase_from_dict
from ddlstudy.config.fields import FORKS, MAX_PROCESSES
from ddlstudy.errors import UsageError
from ddlstudy.machine import environment
from ddlstudy.reading import CAPS, read_bytes
from ddlstudy.records.memory import GIB, memory_of
from ddlstudy.records.runfolder import CHILD_ENV, MANIFEST, load_manifest

log = logging.getLogger("ddlstudy")

_PATHS = ("data_dir", "datasets_dir", "runs_dir")
_HOST_KEYS = ("cpu_model", "usable_cores", "ram_bytes", "gpus", "machine")


def read_manifest(path: Path) -> dict[str, Any]:
    """A run folder or its manifest.json."""
    path = Path(path)
    file = path / MANIFEST if path.is_dir() else path
    if not file.exists():
        raise UsageError(f"{path} is neither a run folder nor a manifest.json")
    manifest = load_manifest(file)
    manifest["path"] = str(file.parent)
    return manifest


def config_from_manifest(manifest: dict[str, Any], runs_dir: Path | None = None) -> RunConfig:
    """The recorded configuration, expecting the recorded data fingerprint."""
    config = dict(manifest["config"])
    usecase = dict(config.pop("usecase"))
    source = usecase.pop("source", "")
    source = source if isinstance(source, str) else ""
    fields = {f.name for f in dataclasses.fields(RunConfig)} - {"usecase"}
    dropped = sorted(set(config) - fields)
    if dropped:
        log.warning("this version of ddlstudy ignores recorded settings: %s", ", ".join(dropped))
    kwargs = {k: v for k, v in config.items() if k in fields}
    if "stage_starts" in fields and kwargs.get("stage_starts") is None:
        # A pipeline cut where its measured times said: cut the replay there too (the
        # cut decides which process draws each dropout mask).
        kwargs["stage_starts"] = (manifest.get("strategy") or {}).get("stage_starts")
    for key in _PATHS:  # a path of another type is refused by its declaration
        if isinstance(kwargs.get(key), str) and kwargs[key]:
            kwargs[key] = Path(kwargs[key])
    if runs_dir is not None:
        kwargs["runs_dir"] = runs_dir
    kwargs["expect_fingerprint"] = (manifest.get("data") or {}).get("fingerprint")
    kwargs["replay_of"] = manifest.get("id")
    _same_world(manifest, kwargs)
    try:
        return RunConfig(usecase=usecase_from_dict(usecase, source=source), **kwargs)
    except UsageError as exc:  # a value the manifest recorded: name the file it is in
        raise UsageError(f"{manifest.get('path', '?')}/{MANIFEST} records {exc}") from None


def _same_world(manifest: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """A run that someone else's launcher started (``--nodes`` left out, the world its
    ``-n``) replays with as many ranks from ddlstudy's own mpiexec, on this host; one whose
    ranks ran on several hosts cannot be placed again from the manifest, and is refused
    with the command that replays it (under srun or mpiexec, whose ranks are the world)."""
    backend = manifest.get("backend") or {}
    if backend.get("name") != "mpi" or kwargs.get("nodes") is not None or \
            environment.under_launcher() and CHILD_ENV not in os.environ:
        return  # a replay under srun or your mpiexec: its ranks are the world
    launched = manifest.get("launch") or {}
    world = int(launched.get("world") or backend.get("nodes") or 1)
    hosts = sorted(set(backend.get("hosts") or []))
    if len(hosts) > 1 and not (kwargs.get("hosts") or kwargs.get("hostfile")):
        how = (f"srun --mpi=pmi2 -N {len(hosts)} -n {world}" if launched.get("launcher") ==
               "srun" else f"mpiexec -n {world} -hosts {','.join(hosts)}")
        raise UsageError(f"run {manifest.get('id')} ran {world} MPI ranks on hosts "
                         f"{','.join(hosts)} under {launched.get('launcher', 'your mpiexec')}; "
                         f"replay it the same way: {how} ddlstudy replay "
                         f"{manifest.get('path', 'RUN')}")
    if world > 1 and launched.get("launcher") != "ddlstudy's mpiexec":
        if world > MAX_PROCESSES:  # refused before it is said to be replayed
            raise UsageError(f"run {manifest.get('id')} records {world} MPI ranks, above the "
                             f"limit of {MAX_PROCESSES}{FORKS}; it cannot be replayed")
        log.warning("run %s ran under %s with %d ranks: replaying them with ddlstudy's own "
                    "mpiexec -n %d", manifest.get("id"), launched.get("launcher", "your "
                    "mpiexec"), world, world)
        kwargs["nodes"] = world


def differences(manifest: dict[str, Any]) -> list[str]:
    """What differs between the machine and code that made the run and this one."""
    out = []
    then, now = manifest.get("versions", {}), environment.versions()
    for name in sorted(set(then) | set(now)):
        if then.get(name) != now.get(name):
            out.append(f"{name} {then.get(name)} then, {now.get(name)} now")
    host_then, host_now = manifest.get("host", {}), environment.host()
    for key in _HOST_KEYS:
        if host_then.get(key) != host_now.get(key):
            out.append(f"host {key}: {host_then.get(key)} then, {host_now.get(key)} now")
    git_then, git_now = manifest.get("git") or {}, environment.git_state() or {}
    if git_then.get("commit") != git_now.get("commit"):
        out.append(f"code: commit {git_then.get('commit')} then, {git_now.get('commit')} now")
    model = manifest.get("model") or {}
    for what, recorded in (("the model's file", model),
                           ("the initial weights", model.get("init_weights") or {})):
        if recorded.get("sha256") and recorded.get("file"):
            now = _sha256(Path(recorded["file"]))
            if now != recorded["sha256"]:
                out.append(f"{what} {recorded['file']}: sha256 {recorded['sha256'][:12]} "
                           f"then, {now[:12] if now else 'missing'} now")
    return out


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(read_bytes(path, "recorded file", CAPS["table"])).hexdigest()
    except UsageError:  # gone, or no longer a regular file
        return None


# --- compare -----------------------------------------------------------------------------

def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out |= _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return {prefix: value}


def _diff(a: dict, b: dict) -> list[tuple[str, Any, Any]]:
    fa, fb = _flatten(a), _flatten(b)
    return [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]


_METRICS = (("median_images_per_s", "images/s", "ratio"),
            ("median_epoch_time_s", "time per epoch (s)", "ratio"),
            ("train_time_s", "training time (s)", "ratio"),
            ("final_val_accuracy", "final validation accuracy", "diff"),
            ("best_val_accuracy", "best validation accuracy", "diff"))
_MEMORY = (("peak_process_bytes", "peak memory per process (GiB)"),
           ("peak_node_bytes", "peak memory per node (GiB)"))
"""The memory figures compare shows (``records.memory.memory_of``'s), in GiB."""


def compare(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Config, environment and metric differences of two runs, as text."""
    lines = [f"A: {a.get('id')} ({a.get('status')})", f"B: {b.get('id')} ({b.get('status')})", ""]
    differ: list[str] = []

    def section(title: str, diffs: list[tuple[str, Any, Any]]) -> None:
        lines.append(f"{title}: " + ("identical" if not diffs else f"{len(diffs)} differ"))
        lines.extend(f"  {k}: {va!r} -> {vb!r}" for k, va, vb in diffs)
        differ.extend(f"{title} ({k})" for k, _, _ in diffs)

    ca, cb = dict(a.get("config", {})), dict(b.get("config", {}))
    for c in (ca, cb):
        c.pop("runs_dir", None)
        c.pop("replay_of", None)
        c.pop("expect_fingerprint", None)
    section("config", _diff(ca, cb))
    section("data", _diff({"fingerprint": a.get("data", {}).get("fingerprint"),
                           "images": a.get("data", {}).get("images")},
                          {"fingerprint": b.get("data", {}).get("fingerprint"),
                           "images": b.get("data", {}).get("images")}))
    env_a = {"versions": a.get("versions", {}), "git": a.get("git") or {},
             "host": {k: a.get("host", {}).get(k) for k in _HOST_KEYS}}
    env_b = {"versions": b.get("versions", {}), "git": b.get("git") or {},
             "host": {k: b.get("host", {}).get(k) for k in _HOST_KEYS}}
    section("environment", _diff(env_a, env_b))
    # How each was started: launcher, world, behaviour-changing variables, builds (not the
    # working directory, which only says where the command was typed).
    la, lb = ({k: v for k, v in (m.get("launch") or {}).items() if k != "cwd"} for m in (a, b))
    if la or lb:
        section("launch", _diff(la, lb))
    lines.append("metrics (B against A):")
    sa, sb = a.get("summary") or {}, b.get("summary") or {}
    lines += [_metric(name, sa.get(key), sb.get(key), how) for key, name, how in _METRICS]
    ma, mb = memory_of(a), memory_of(b)
    lines += [_metric(name, *(None if m[key] is None else m[key] / GIB for m in (ma, mb)),
                      "ratio") for key, name in _MEMORY]
    ea, eb = a.get("epochs") or [], b.get("epochs") or []
    n = min(len(ea), len(eb))
    lines += _per_epoch(ea, eb, n)
    if len(ea) != len(eb):
        lines.append(f"  epochs: {len(ea)} -> {len(eb)}")
    if n and any(ea[i]["train_loss"] != eb[i]["train_loss"] for i in range(n)):
        lines.append("the losses differ, " + (
            "and so do: " + ", ".join(differ) if differ else
            "nothing recorded differs, so the run itself is not bit-reproducible (threads "
            "summing in another order, an MPI reduction order, a kernel without a fixed "
            "algorithm)"))
    return "\n".join(lines)


def _metric(name: str, va: float | None, vb: float | None, how: str) -> str:
    """A figure of both runs, and B's against A's (a ratio, or a difference)."""
    if va is None or vb is None:
        return f"  {name}: {va} -> {vb}"
    if how == "ratio":
        return f"  {name}: {va:.4g} -> {vb:.4g} (x{vb / va:.3f})" if va \
            else f"  {name}: {va} -> {vb}"
    return f"  {name}: {va:.4f} -> {vb:.4f} ({vb - va:+.4f})"


def _per_epoch(ea: list[dict], eb: list[dict], n: int) -> list[str]:
    """How far apart the two runs' losses and accuracy are over their first ``n`` epochs."""
    lines = []
    for key in ("train_loss", "val_loss", "val_accuracy") if n else ():
        pairs = [(ea[i].get(key), eb[i].get(key)) for i in range(n)]
        if any(x is None for pair in pairs for x in pair):
            lines.append(f"  {key} per epoch: not recorded in both")
            continue
        gap = max(abs(x - y) for x, y in pairs)
        lines.append(f"  {key} per epoch: " + ("identical" if gap == 0 else
                                               f"largest difference {gap:.3g}")
                     + f" over {n} epoch(s)")
    return lines


def resume_config(path: Path) -> RunConfig:
    """The configuration a run folder recorded, to continue it (its data must not change)."""
    manifest = read_manifest(path)
    cfg = config_from_manifest(manifest, Path(manifest["path"]).parent)
    return dataclasses.replace(cfg, replay_of=manifest["config"].get("replay_of"))
