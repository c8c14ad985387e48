"""The advice as text: ``advise.md``'s Markdown, and ``write`` (advise.json beside it)."""

from __future__ import annotations

from pathlib import Path

from ddlstudy.files import atomic_write_json, atomic_write_text
from ddlstudy.sampler import NOISY_CORES
from ddlstudy.tools.advise.ranking import CHANGES, SAME


def markdown(result: dict, top: int = 10) -> str:
    where = result["link"] and f"a {result['link']} link between machines like this one" \
        or result["hosts"] or "this host (nodes share its cores and memory)"
    lines = [f"# ddlstudy advise: {result['usecase']}", "",
             f"{result['cores']} cores, {result['gpus']} GPU(s); nodes {result['nodes']} on "
             f"{where}; {result['rounds']} probe round(s) in {result['seconds']:.0f} s "
             f"(budget {result['budget_s']:.0f} s"
             + (f"; {result['waited_s']:.0f} s more waiting for a quiet host"
                if result.get("waited_s") else "") + ")", ""]
    conv = result["convergence"]
    ttt = bool(conv.get("factor"))
    lines.append(f"ranked by {'predicted time to ' + str(conv['target']) if ttt else 'images/s'}"
                 f"; {result['sureness']}")
    if conv.get("note"):
        lines.append(f"({conv['note']})")
    best: dict[int, dict] = {}
    for r in result["ranking"]:
        if r.get("list", SAME) == SAME:
            best.setdefault(r["nodes"], r)
    named = {r["rank"] for r in best.values()}
    for title, rows in ((f"{SAME} as the baseline", [
            r for r in result["ranking"] if r.get("list", SAME) == SAME]),
                        (f"{CHANGES} (another model is trained: ranked by images/s only, "
                         "its epochs to target not measured; measure them with --runs)", [
            r for r in result["ranking"] if r.get("list", SAME) == CHANGES])):
        shown = [r for i, r in enumerate(rows) if i < top or r["rank"] in named]
        if shown:
            lines += ["", f"## {title}", ""] + _table(shown, ttt)
            if len(shown) < len(rows):
                lines.append(f"\n({len(rows) - len(shown)} more in advise.json)")
    lines += ["", f"best per node count ({SAME}):", ""]
    lines += [f"- {n}: {r['label']}, {r['images_per_s']:.1f} images/s (rank {r['rank']})"
              for n, r in sorted(best.items())]
    lines += [f"- {note}" for note in result["notes"]]
    noisy = [n for p in result["probes"] for n in p.get("noisy", [])]
    if noisy:
        lines.append(f"- {len(noisy)} probe(s) ran while other processes kept more than "
                     f"{NOISY_CORES} cores of this host busy (up to "
                     f"{max(n['others_cores'] for n in noisy):.2f}): not counted where the "
                     "configuration had a quiet probe; rows marked 'busy host' had none. "
                     "--wait-quiet waits for a quiet host before each probe")
    skipped = [p for p in result["probes"] if "skipped" in p]
    if skipped:
        lines += ["", "not probed:", ""] + [f"- {p['label']}: {p['skipped']}" for p in skipped]
    return "\n".join(lines)


def _table(rows: list[dict], ttt: bool) -> list[str]:
    lines = ["| rank | configuration | nodes | images/s (probes) | basis | speedup | "
             "efficiency |" + (" time to target |" if ttt else "") + " convergence | how |",
             "|---|---|---|---|---|---|---|" + ("---|" if ttt else "") + "---|---|"]
    for r in rows:
        how = f"`{r['command']}`" if r["runnable"] else \
            "predicted for that link: run it with --hostfile on such machines"
        lines.append(f"| {r['rank']} | {r['label']} | {r['nodes']} | {r['images_per_s']:.1f} "
                     f"({r['low']:.1f}-{r['high']:.1f}) | {r['basis']}"
                     f"{', busy host' if r.get('noisy') else ''} | {r['speedup']:.2f} | "
                     f"{r['efficiency']:.0%} |"
                     + (f" {_figure(r['time_to_target_s'], ' s')} |" if ttt else "")
                     + f" {r['convergence']} | {how} |")
    return lines


def write(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "advise.json", out / "advise.md"]
    atomic_write_json(paths[0], result)
    atomic_write_text(paths[1], markdown(result) + "\n")
    return paths


def _figure(value: float | None, unit: str = "") -> str:
    return "never" if value is None else f"{value:.1f}{unit}"
