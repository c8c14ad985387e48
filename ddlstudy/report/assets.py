"""The page's style and script, written into it (``page``): the page works offline, opened
from disk or attached to a mail or an MLflow run, and asks nothing of any network.

The style keeps the page within 1280 px (tables wrap their text; the table of every column
scrolls inside its own box) and prints: the controls hidden, every run's figures unfolded
(``details::details-content``, and the script's ``beforeprint`` for browsers without it).
The script sorts the summary by a column (numbers by their value, missing values last),
filters its rows by use case, strategy and backend, and shows the table of every column.
"""

CSS = """
:root { --ink: #1d2430; --muted: #5b6573; --line: #d8dde4; --band: #f4f6f8;
        --good: #1f7a3a; --bad: #b3261e; --open: #8a5a00; --accent: #c2410c; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--ink); background: #fff; }
main { max-width: 1240px; margin: 0 auto; padding: 8px 20px 40px; }
h1 { font-size: 1.6rem; margin: 16px 0 4px; }
h2 { font-size: 1.3rem; margin: 32px 0 8px; border-bottom: 2px solid var(--line);
     padding-bottom: 4px; }
h3 { font-size: 1.1rem; margin: 22px 0 6px; }
h4 { font-size: 1rem; margin: 16px 0 4px; }
p, li { max-width: 100ch; }
a { color: #1a56a8; }
.meta, .note, figcaption { color: var(--muted); font-size: 0.92rem; }
nav.toc a { margin-right: 14px; }
.answer { display: grid; grid-template-columns: repeat(auto-fit, minmax(360px, 1fr));
          gap: 12px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 16px;
        background: var(--band); }
.card h3 { margin-top: 4px; }
.card ul { margin: 0; padding-left: 18px; }
table { border-collapse: collapse; width: 100%; font-size: 0.9rem; }
th, td { border-bottom: 1px solid var(--line); padding: 4px 6px; text-align: left;
         vertical-align: top; overflow-wrap: anywhere; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums;
                 overflow-wrap: normal; white-space: nowrap; }
td.tight { white-space: nowrap; }
thead th { background: var(--band); position: sticky; top: 0; overflow-wrap: normal; }
th button { font: inherit; font-weight: 600; border: 0; background: none; padding: 0;
            cursor: pointer; color: inherit; text-align: inherit; }
th[aria-sort="ascending"] button::after { content: " \\25B2"; }
th[aria-sort="descending"] button::after { content: " \\25BC"; }
tr.noisy td { background: #fff7e6; }
.controls { display: flex; flex-wrap: wrap; gap: 14px; align-items: center;
            margin: 8px 0; }
.controls label { font-size: 0.92rem; }
.scroll { overflow-x: auto; max-width: 100%; border: 1px solid var(--line); }
.scroll table { width: max-content; min-width: 100%; }
.scroll td, .scroll th { overflow-wrap: normal; white-space: nowrap; }
.verdict { font-weight: 600; padding: 0 6px; border-radius: 4px; }
.v-confirmed { color: var(--good); } .v-refuted { color: var(--bad); }
.v-inconclusive, .v-mixed { color: var(--open); } .v-not-measured { color: var(--muted); }
.finding { border-left: 4px solid var(--line); padding: 2px 12px; margin: 12px 0; }
.finding.v-confirmed { border-color: var(--good); }
.finding.v-refuted { border-color: var(--bad); }
.finding ul { margin: 4px 0; }
.projected { color: var(--muted); }
figure { margin: 12px 0 24px; break-inside: avoid; }
figure svg { display: block; max-width: 100%; height: auto; }
details.run { border: 1px solid var(--line); border-radius: 6px; margin: 6px 0;
              padding: 4px 10px; }
details.run > summary { cursor: pointer; }
details.run[open] > summary { margin-bottom: 6px; }
.run-figures { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr));
               gap: 12px; }
footer { margin-top: 40px; color: var(--muted); font-size: 0.85rem; }
@media print {
  .controls, nav.toc, th button::after { display: none; }
  main { max-width: none; padding: 0; }
  details::details-content { content-visibility: visible; display: block; }
  .scroll { overflow: visible; border: 0; }
  .scroll table { width: 100%; font-size: 7pt; }
  .scroll td, .scroll th { white-space: normal; }
  thead th { position: static; }
  h2 { break-after: avoid; }
}
"""

JS = r"""
(function () {
  "use strict";
  var summary = document.getElementById("configurations");
  if (summary) {
    var body = summary.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var value = function (row, col) {
      var cell = row.cells[col];
      var v = cell.getAttribute("data-value");
      if (v === null) { return cell.textContent.trim().toLowerCase(); }
      var n = parseFloat(v);
      return isNaN(n) ? null : n;
    };
    Array.prototype.forEach.call(summary.tHead.rows[0].cells, function (th, col) {
      var button = th.querySelector("button");
      if (!button) { return; }
      button.addEventListener("click", function () {
        var numeric = th.classList.contains("num");
        var now = th.getAttribute("aria-sort");
        var dir = now ? (now === "ascending" ? -1 : 1) : (numeric ? -1 : 1);
        Array.prototype.forEach.call(summary.tHead.rows[0].cells, function (other) {
          other.removeAttribute("aria-sort");
        });
        th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
        rows.sort(function (a, b) {
          var x = value(a, col), y = value(b, col);
          if (x === null || x === "") { return (y === null || y === "") ? 0 : 1; }
          if (y === null || y === "") { return -1; }
          return x < y ? -dir : x > y ? dir : 0;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
    var filters = Array.prototype.slice.call(document.querySelectorAll("select[data-filter]"));
    var count = document.getElementById("shown");
    var apply = function () {
      var shown = 0;
      rows.forEach(function (row) {
        var keep = filters.every(function (f) {
          return !f.value || row.getAttribute("data-" + f.getAttribute("data-filter")) === f.value;
        });
        row.hidden = !keep;
        shown += keep ? 1 : 0;
      });
      if (count) { count.textContent = shown + " of " + rows.length; }
    };
    filters.forEach(function (f) { f.addEventListener("change", apply); });
    apply();
  }
  var toggle = document.getElementById("show-full");
  var full = document.getElementById("full");
  if (toggle && full) {
    toggle.addEventListener("change", function () { full.hidden = !toggle.checked; });
  }
  var closed = [];
  window.addEventListener("beforeprint", function () {
    closed = Array.prototype.filter.call(document.querySelectorAll("details"), function (d) {
      return !d.open;
    });
    closed.forEach(function (d) { d.open = true; });
  });
  window.addEventListener("afterprint", function () {
    closed.forEach(function (d) { d.open = false; });
  });
})();
"""
