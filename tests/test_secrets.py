"""A secret in any spelling (issue 64): whatever a URI's user info, query and fragment hold
is never written, printed or sent, however it was typed (a password holding ``#``, ``/``,
a space, a quote or an ``@``; ``?pass=``; ``#token=``). The gate (``ddlstudy.redact``)
under typed spellings (hypothesis), then every refusal of such a URI through the command
line: one line, exit 2, the secret in none of it, nothing written. What MLflow's own
client prints, against a real server, is tests/test_mlflow.py's."""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlstudy import redact
from ddlstudy.cli import main
from ddlstudy.config import RunConfig, with_overrides
from ddlstudy.redact import HIDDEN, redacted, remember, shown
from ddlstudy.runner import run as train

EXAMPLES = settings(max_examples=int(os.environ.get("DDLSTUDY_EXAMPLES", 200)), deadline=None)
TYPED = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
"""Anything a user can type into a password, a query or a fragment."""
SCHEMES = st.sampled_from(["http", "https", "postgresql", "mysql+pymysql", "sqlite", "file"])
HOSTS = st.from_regex(r"[a-z][a-z0-9.-]{0,9}(:[0-9]{1,5})?", fullmatch=True)
PATHS = st.from_regex(r"(/[A-Za-z0-9._-]{0,6}){0,3}", fullmatch=True)


@st.composite
def typed_uris(draw, marks: bool = False) -> tuple[str, str, list[str]]:
    """(a URI as typed, the shown form it must have where it can be read one way, its
    secrets); with ``marks``, each secret holds a mark no other part can."""
    scheme, host, path = draw(SCHEMES), draw(HOSTS), draw(PATHS)

    def secret(mark: str) -> str:
        return draw(TYPED) + (mark if marks else "") + draw(TYPED)

    user = draw(st.one_of(st.none(), TYPED))
    password = secret("Pw9Mark") if user is not None else None
    query = secret("Qy9Mark") if draw(st.booleans()) else None
    fragment = None if draw(st.booleans()) else secret("Fr9Mark")
    userinfo = None if user is None else f"{user}:{password}@"
    uri = (f"{scheme}://{userinfo or ''}{host}{path}" + (f"?{query}" if query is not None
                                                          else "") +
           (f"#{fragment}" if fragment is not None else ""))
    # a "#" typed in the query begins a fragment, as every reader of the URI takes it
    fragmented = fragment is not None or (query is not None and "#" in query)
    clean = (f"{scheme}://{host}{path}" + (f"?{HIDDEN}" if query is not None else "") +
             (f"#{HIDDEN}" if fragmented else ""))
    return uri, clean, [s for s in (user, password, query, fragment) if s]


@EXAMPLES
@given(typed_uris())
def test_a_typed_uri_is_shown_without_its_user_info_query_and_fragment(typed):
    """Exactly the scheme, host, port and path, and a mark where a query or fragment was;
    or, where a ``?`` or ``#`` comes before the last ``@`` (a password's, or a query's
    ``@``: the two cannot be told apart), nothing after the scheme."""
    uri, clean, _ = typed
    scheme = uri.split("://")[0]
    assert shown(uri) in (clean, f"{scheme}://{HIDDEN}")
    before_at = uri[len(scheme) + 3:uri.rfind("@")] if "@" in uri else ""
    if "?" not in before_at and "#" not in before_at:
        assert shown(uri) == clean
    assert shown(shown(uri)) == shown(uri)


@EXAMPLES
@given(typed=typed_uris(marks=True), before=st.sampled_from(["", "MLflow (", "at ", "'", '"',
                                                              "[", "uri=", "\n"]),
       after=st.sampled_from(["", "): failed", " is down", "'", '"', "]", ",", "\n"]),
       quote=st.sampled_from([str, repr, json.dumps]))
def test_a_uri_given_to_ddlstudy_is_taken_out_of_any_text(typed, before, after, quote):
    """Remembered when it was given (``--mlflow``, ``--tracking-uri``): in a log line,
    an error from another library, repr'd or JSON-quoted, its secrets are gone."""
    uri = typed[0]
    remember(uri)
    text = redact.redact(f"{before}{quote(uri)}{after}")
    assert not re.search("Pw9Mark|Qy9Mark|Fr9Mark", text), (uri, text)


@contextmanager
def _told_of_none():
    """``redact`` as in a process that was given no URI (the ones remembered set aside)."""
    with patch.object(redact, "_KNOWN", {}), patch.object(redact, "_PIECES", set()):
        yield


@EXAMPLES
@given(typed=typed_uris(marks=True), flag=st.sampled_from(["", "--mlflow="]))
def test_a_json_record_holds_no_secret_of_a_uri_it_was_never_told_of(typed, flag):
    """A record's string that is a URI (a config value, an argument) is shown whole, as
    the value it is, whatever its password holds (a space, a quote): nothing remembered."""
    uri = typed[0]
    record = {"config": {"mlflow": uri}, "command": ["run", "--mlflow", uri, f"{flag}{uri}"]}
    with _told_of_none():
        text = json.dumps(redacted(record))
    assert not re.search("Pw9Mark|Qy9Mark|Fr9Mark", text), (uri, text)


@EXAMPLES
@given(typed=typed_uris(marks=True))
def test_a_uri_never_told_of_in_a_line_loses_what_parses(typed):
    """In a line of text (a library's error), a URI ddlstudy was never given: taken out
    to the next space or quote, which is all a line can say of where it ends."""
    uri, _, secrets = typed
    if any(re.search(r"[\s\"'<>`]", s) for s in secrets):
        return  # where a secret ends in free text only ``remember`` can know
    with _told_of_none():
        text = redact.redact(f"request to {uri} failed")
    assert not re.search("Pw9Mark|Qy9Mark|Fr9Mark", text), (uri, text)


REFUSED = {
    "http://me:Pw#Sec1ret@127.0.0.1:5000": "cannot be read one way",
    "http://me:Pw?Sec2ret@127.0.0.1:5000": "cannot be read one way",
    "http://127.0.0.1:5000/?pass=Sec3ret": "takes no query or fragment",
    "http://127.0.0.1:5000/#token=Sec4ret": "takes no query or fragment",
    "https://me:Sec5ret@ho st:5000": "give a server as http://host:port",
    "file:///tmp/store?token=Sec6ret": "a file: store takes no user",
    "file://me:Sec7ret@/tmp/store": "a file: store takes no user",
    "sqlite:///tmp/m.db#Sec8ret": "a sqlite: store takes no user",
    "me:Sec9ret@127.0.0.1:5000": "is not a tracking URI MLflow takes",
    "mongodb://me:Sec10ret x@host": "is not a tracking URI MLflow takes",
    "http://me:Sec11ret'\"@127.0.0.1:5000\t": "is not a tracking URI MLflow takes",
}
"""Spellings refused, each with its secret (``Sec...ret``) and what the refusal says."""


def _tree(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _refused(argv: list[str], said: str, capsys) -> None:
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("ddlstudy: error: ") and \
        out.err.count("\n") == 1, out
    assert said in out.err and not re.search(r"Sec\d+ret", out.err), out.err


@pytest.fixture(scope="module")
def runs(tmp_path_factory, datasets_dir, tiny) -> Path:
    """A folder of one finished run (one step), for `export mlflow` to be given."""
    root = tmp_path_factory.mktemp("secret-runs")
    train(RunConfig(usecase=with_overrides(tiny, epochs=1), datasets_dir=datasets_dir,
                    runs_dir=root, max_steps=1, sample_hz=0, snapshot=False),
          show_progress=False)
    return root


@pytest.mark.parametrize("uri", list(REFUSED))
def test_a_refused_uri_is_said_in_one_line_without_its_secret(uri, runs, tmp_path, capsys):
    """`run --mlflow`, `export mlflow --tracking-uri` and a plan's mlflow: refused before
    anything is written, the value named as it may be shown."""
    plan = tmp_path / "plan.toml"
    plan.write_text(f'[study]\nname = "sec"\nusecases = ["tiny"]\n[settings]\n'
                    f'mlflow = {json.dumps(uri)}\n[[cells]]\nstrategy = "sequential"\n')
    before, runs_before = _tree(tmp_path), _tree(runs)
    _refused(["run", "--usecase", "tiny", "--mlflow", uri, "--runs-dir",
              str(tmp_path / "runs")], "--mlflow: ", capsys)
    _refused(["export", "mlflow", str(runs), "--tracking-uri", uri], REFUSED[uri], capsys)
    _refused(["study", str(plan), "--runs-dir", str(tmp_path / "study")], REFUSED[uri],
             capsys)
    assert _tree(tmp_path) == before and _tree(runs) == runs_before


@pytest.mark.parametrize("uri", ["http://me:Pw/Sec12ret x@127.0.0.1:5000",
                                 "http://me:Sec13ret'@127.0.0.1:5000",
                                 "sqlite:///{tmp}/m.db?Sec14ret=1",
                                 "postgresql://me:Sec15ret@127.0.0.1/db"])
def test_a_plan_whose_uri_holds_a_secret_is_never_written_into_a_batch_script(
        uri, tmp_path, capsys):
    """`study --submit slurm`: a URI MLflow can use, but whose user info or query a batch
    script would keep on disk, in any spelling, is refused before Slurm is asked."""
    plan = tmp_path / "plan.toml"
    plan.write_text(f'[study]\nname = "sec"\nusecases = ["tiny"]\n[settings]\n'
                    f'mlflow = {json.dumps(uri.format(tmp=tmp_path))}\n'
                    f'[[cells]]\nstrategy = "sequential"\n')
    before = _tree(tmp_path)
    _refused(["study", str(plan), "--submit", "slurm", "--runs-dir", str(tmp_path / "study")],
             "holds a secret, which its batch script would keep on disk", capsys)
    assert _tree(tmp_path) == before
