"""The one gate a secret given inside a URI goes through: whatever a URI's user info, query
and fragment hold is never written, printed, logged or uploaded, in any message (refusals
included), however it was typed.

A URI is read as a user types it, not only as it parses cleanly: its user info runs to the
*last* ``@`` (a password may hold ``/``, ``#``, ``?``, a space, a quote or an ``@``), and
whatever follows the first ``?`` or ``#`` after it is a query or a fragment. Where a ``?``
or ``#`` comes before that ``@`` (a password holding one, or a query holding an ``@``: the
two cannot be told apart), all of it after the scheme is hidden. So
``http://me:pa/s s@host:5000/x?pass=1#token=2`` is shown ``http://host:5000/x?***#***``
and ``http://me:p#w@host`` is shown ``http://***`` (``shown``).

Three layers, each for what the one before cannot know:

- ``shown(uri)``: a whole value known to be a URI (a tracking URI given to ddlstudy), exact;
  what every message that names one is composed with.
- ``remember(uri)``: the URIs this process was given (``--mlflow``, ``--tracking-uri``, a
  plan's ``mlflow``, through ``exports.mlflow.store.resolved``, the one check they pass):
  ``redact`` replaces each one wherever it appears in any text, as typed and as ``repr``
  or JSON quote it, and its password, query and fragment (6 characters or more) on their
  own, percent-decoded too.
- ``redact(text)``: any text (a log line, an error from MLflow or requests, a JSON record
  through ``files.atomic_write_json`` and ``redacted``): the remembered URIs, then every
  ``scheme://`` token in it (to the next space or quote) as ``shown``.

The URI as given is still what connects (in memory, in the configuration); an HTTP
server's user and password go to MLflow through its own variables, never in the URI it is
handed (``exports.mlflow.store.handed``). Credentials are best given that way from the
start: ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD`` are copied nowhere.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple
from urllib.parse import unquote

HIDDEN = "***"
SHORTEST_PIECE = 6
"""A remembered URI's password, query or fragment is also taken out on its own where it is
at least this long (a shorter one would take ordinary words with it)."""

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_TOKEN = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>`]*")
_WHOLE = re.compile(r"(--[A-Za-z0-9-]+=)?(?=[A-Za-z][A-Za-z0-9+.-]*://)")
_SHOWN_END = re.compile(r"\*\*\*([).,;:!\]]+)$")
_KNOWN: dict[str, str] = {}
"""Each form of each remembered URI (as typed, as repr and JSON quote it): its shown form."""
_PIECES: set[str] = set()


class Parts(NamedTuple):
    """A URI as typed, in the pieces ``shown`` keeps or hides."""

    head: str  # "http://", "file:" (no authority), "" (no scheme: a path)
    userinfo: str | None  # to the last "@", where there is one
    address: str  # host, port and path (a path's own "@" kept where there is no host)
    query: str | None
    fragment: str | None
    ambiguous: bool  # a "?" or "#" before the last "@": everything after the scheme hidden


def split(uri: str) -> Parts:
    """``uri`` (a whole value) as typed: its user info to the last ``@``, then its address
    to the first ``?`` or ``#``. A value without a scheme is a path: all address."""
    scheme = _SCHEME.match(uri)
    if scheme is None:
        return Parts("", None, uri, None, None, False)
    head, rest = scheme.group(0), uri[scheme.end():]
    if rest.startswith("//"):
        head, rest = head + "//", rest[2:]
        # an empty authority ("http:///...") is a path, but for a "user:password@" in it:
        # a user name typed beginning with "/" (hiding a path's "x:y@" too is the safe side)
        has_user = "@" in rest and (re.match(r"[^/?#]*", rest).group(0) != ""  # type: ignore
                                    or ":" in rest[:rest.rfind("@")])
    else:  # no authority: "file:/x?y", or a scheme-less "me:pw@host" taken for one
        has_user = "@" in rest
    userinfo = None
    if has_user:
        userinfo, rest = rest[:rest.rfind("@")], rest[rest.rfind("@") + 1:]
    address = re.match(r"[^?#]*", rest).group(0)  # type: ignore[union-attr]
    tail = rest[len(address):]
    query = fragment = None
    if tail.startswith("?"):
        query, _, fragment = tail[1:].partition("#")
        fragment = fragment if "#" in tail else None
    elif tail.startswith("#"):
        fragment = tail[1:]
    ambiguous = userinfo is not None and ("?" in userinfo or "#" in userinfo)
    return Parts(head, userinfo, address, query, fragment, ambiguous)


def shown(uri: str) -> str:
    """``uri``, a whole value, without what its user info, query and fragment hold:
    ``http://host:5000/x?***#***``; the user info is left out (``***@host`` where the value
    has no ``//``), and all after the scheme is ``***`` where it is ambiguous."""
    parts = split(uri)
    if parts.ambiguous:
        return parts.head + HIDDEN if parts.head.endswith("//") else HIDDEN
    head = parts.head if parts.userinfo is None or parts.head.endswith("//") else \
        f"{HIDDEN}@"
    return (head + parts.address + (f"?{HIDDEN}" if parts.query is not None else "") +
            (f"#{HIDDEN}" if parts.fragment is not None else ""))


def remember(uri: str) -> str:
    """``shown(uri)``, and ``uri`` remembered for ``redact``: taken out of any text this
    process writes from now on, however quoted, its secret pieces too."""
    clean = shown(uri)
    if clean == uri:
        return clean
    for form in (uri, repr(uri)[1:-1], json.dumps(uri)[1:-1]):
        _KNOWN[form] = clean
    parts = split(uri)
    password = (parts.userinfo or "").partition(":")[2]
    for piece in (parts.userinfo, password, parts.query, parts.fragment):
        for form in {piece or "", unquote(piece or "")}:
            if len(form) >= SHORTEST_PIECE:
                _PIECES.add(form)
    return clean


def redact(text: str) -> str:
    """``text`` with every remembered URI (and its secret pieces) and every ``scheme://``
    token in it shown as ``shown`` shows them."""
    for known in sorted(_KNOWN, key=len, reverse=True):
        if known in text:
            text = text.replace(known, _KNOWN[known])
    for piece in sorted(_PIECES, key=len, reverse=True):
        if piece in text:
            text = text.replace(piece, HIDDEN)
    if "://" in text:
        text = _TOKEN.sub(_token, text)
    return text


def _token(found: re.Match) -> str:
    """A token already shown, with a mark after it (``(http://host/?***):``), keeps the
    mark."""
    token = found.group(0)
    end = _SHOWN_END.search(token)
    if end:
        return shown(token[:end.start(1)]) + end.group(1)
    return shown(token)


def redacted(value: Any) -> Any:
    """A JSON-able value with every string in it (keys included) ``redact``-ed; a string
    that is a URI (or ``--flag=URI``) is ``shown`` whole, as the value it is."""
    if isinstance(value, str):
        whole = _WHOLE.match(value)
        if whole:
            value = value[:whole.end()] + shown(value[whole.end():])
        return redact(value)
    if isinstance(value, dict):
        return {redacted(k): redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    return value
