"""The documentation: the MkDocs site builds strictly (a broken link, anchor, page or
included file fails), the reference pages are what the code generates and leave nothing
undescribed, the README stays a front door whose commands parse, every module path the
pages name exists, and the examples the pages include run."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ddlstudy.cli import build_parser
from ddlstudy.cli import reference as ref

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
PAGES = [ROOT / "README.md", ROOT / "usecases" / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`, as `make docs` runs it, into a folder of its own."""
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                          str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=os.environ | {"NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    site = tmp_path / "site"
    assert "Which parallelism trains" in (site / "index.html").read_text()
    extending = (site / "extending" / "index.html").read_text()
    assert "CpuLoaders" in extending and "gather_mean" in extending  # the included code


def test_the_reference_pages_are_generated_from_the_code():
    """docs/reference/ is what `python -m ddlstudy.cli.reference` writes (`make docs`
    does): a flag, key or name changed in the code without the pages fails here."""
    for name, text in ref.pages().items():
        assert (DOCS / "reference" / name).read_text() == text, \
            f"docs/reference/{name} is out of date: run python -m ddlstudy.cli.reference"


def test_every_flag_key_and_registry_entry_has_a_description():
    assert ref.undescribed() == []


def test_the_reference_lists_every_run_flag_key_and_name():
    from ddlstudy.backends import REGISTRY as BACKENDS
    from ddlstudy.config.options import run_parser
    from ddlstudy.reducers import REGISTRY as REDUCERS
    from ddlstudy.strategies import REGISTRY as STRATEGIES

    pages = ref.pages()
    flags = {o for a in run_parser()._actions for o in a.option_strings} - {"-h", "--help"}
    assert [f for f in sorted(flags) if f"`{f}`" not in pages["cli.md"]] == []
    assert [k for _, k, _, _ in ref.usecase_keys() if f"`{k}`" not in pages["usecase.md"]] == []
    plan_keys = [k for k, _, _ in ref.plan_keys() + ref.cell_rows()]
    assert [k for k in plan_keys if f"`{k}`" not in pages["plan.md"]] == []
    names = [*ref.own(STRATEGIES), *ref.own(BACKENDS), *ref.own(REDUCERS)]
    assert len(names) >= 15 and [n for n in names if f"`{n}`" not in pages["registries.md"]] == []


def commands(page: Path) -> list[list[str]]:
    """The `ddlstudy` command lines a page shows (continued lines joined, comments and
    what follows `&&` dropped, a placeholder such as `runs/<id>` made a word)."""
    found, lines = [], page.read_text().splitlines()
    for i, line in enumerate(lines):
        if not re.match(r"\s+(sudo )?\.venv/bin/ddlstudy ", line):
            continue
        text = line.split("#")[0].strip()
        while text.endswith("\\"):
            i += 1
            text = text[:-1] + " " + lines[i].split("#")[0].strip()
        argv = shlex.split(re.sub(r"<[^>]*>", "X", text.split("&&")[0]))
        found.append(argv[[a.endswith("/ddlstudy") for a in argv].index(True) + 1:])
    return found


def test_the_readme_is_a_front_door():
    """At most 150 lines, with the five quickstart commands."""
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 150
    assert len(commands(readme)) >= 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_a_page_shows_is_one_the_parser_takes(page):
    for argv in commands(page):
        if "--help" not in argv:
            build_parser().parse_args(argv)


PATH = r"(?<![\w/.~-])((?:ddlstudy|tests|docs/examples|usecases)/[\w/.-]*\w)"
"""A path in the checkout: a module, a test, an example, a use case (a placeholder such as
`ddlstudy/reducers/<reducer>.py` does not match)."""


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_page_names_exists(page):
    """Module paths (`ddlstudy/...py`), test and example files, and the README's links."""
    text = page.read_text()
    named = set(re.findall(PATH, text))
    missing = [n for n in sorted(named) if not (ROOT / n).exists()]
    if page.parent == ROOT or page.parent.name == "usecases":  # links outside the site
        links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
        missing += [link for link in links if not (page.parent / link).exists()]
    assert missing == []


def _example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_quickstart_plan_is_a_valid_plan():
    from ddlstudy.records.plan import configs, load_plan

    plan = load_plan(EXAMPLES / "quickstart.toml")
    assert [cfg.strategy for _, _, cfg in configs(plan, {})] == \
        ["sequential", "cpu-processes", "sequential"]


def test_the_example_model_is_a_model_ddlstudy_builds(tmp_path):
    import torch

    from ddlstudy.config import ModelSpec
    from ddlstudy.models.sources import made

    model = _example("my_model").make(num_classes=3)
    assert model(torch.zeros(2, 3, 64, 64)).shape == (2, 3)
    built = made(ModelSpec(arch=f"{EXAMPLES / 'my_model.py'}:make"), 3)
    assert isinstance(built, torch.nn.Module)


REDUCER_CHECK = """
import json, sys
from importlib.metadata import EntryPoint
import numpy as np
from mpi4py import MPI
sys.path.insert(0, sys.argv[1])
from ddlstudy.reducers import REGISTRY, get_reducer
REGISTRY._load(EntryPoint(name="gather-mean", value="ddlstudy_reducer:GATHER_MEAN",
                          group="ddlstudy.reducers"))  # as an installed plugin is loaded
comm = MPI.COMM_WORLD
buf = np.random.default_rng(comm.Get_rank()).random(1001, dtype=np.float32)
expected = np.mean(comm.allgather(buf.copy()), axis=0)
get_reducer("gather-mean")(comm, buf)
if comm.Get_rank() == 0:
    print(json.dumps({"close": bool(np.allclose(buf, expected, rtol=1e-6)),
                      "terms": REGISTRY["gather-mean"].terms(2)}))
"""


def test_the_example_reducer_averages_under_mpiexec():
    """docs/examples/ddlstudy_reducer.py, loaded through the registry's plugin path and run
    between 2 ranks of the mpich wheel's mpiexec."""
    from ddlstudy.backends.mpi.launch import find_mpiexec

    assert _example("ddlstudy_reducer").GATHER_MEAN.name == "gather-mean"
    out = subprocess.run([find_mpiexec(), "-n", "2", sys.executable, "-c", REDUCER_CHECK,
                          str(EXAMPLES)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"close": True, "terms": [1, 1]}


def test_the_extending_page_includes_the_tested_plugin():
    """The page shows tests/plugin/ (which tests/test_extend.py installs and runs) by
    including the files, never a copy of them."""
    page = (DOCS / "extending.md").read_text()
    for included in ("tests/plugin/ddlstudy_example.py", "tests/plugin/pyproject.toml",
                     "docs/examples/ddlstudy_reducer.py"):
        assert f'--8<-- "{included}"' in page
