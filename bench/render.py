"""`python -m bench.render`: BENCHMARKS.md and README's headline, rendered from the result records in
`bench/results/*.json`, so that every figure on those pages is one a committed record holds.

A record is one table: what was measured (`capability`, `title`), how (`command`), where (`machine`), when
(`date`), on which code (`commit`) and where its numbers come from (`source`: a raw result file, or the report
they were transcribed from). Its `rows` hold one figure each, measured in one or more rounds; a comparison
record has two `columns` (ours, then the other engine or setting) and each round is a pair.

The rendering never quotes one round as the result: each comparison shows the median ratio, the spread of the
rounds (min-max) and a reading of the rounds that calls a ratio within `LEVEL` of 1 a tie. A lead of a few
percent on machines that drift by more than that is not a win, and a table that disagrees with itself says so.
Numbers come from raw result files (`raw`: what `python -m bench ... --out FILE` saved; each row's `paths` say
where in it, `*` for a list of rounds, and each file adds its rounds) or, where the only record of a figure was
the text of an old report, from `rounds` transcribed from that report.

To add a result: run the bench with `--out bench/results/raw/<date>-<what>.json`, add a record that points at it,
e.g. for `--experiments vs-vllm --vllm-rounds 3` rows with
`"paths": ["vs_vllm.rounds.*.ours.chat.output_tokens_per_s", "vs_vllm.rounds.*.vllm.chat.output_tokens_per_s"]`,
then run `python -m bench.render` and commit the three files.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PAGE = REPO / "BENCHMARKS.md"
README = REPO / "README.md"
HEADLINE_START = "<!-- bench.render: headline (python -m bench.render rewrites this block) -->"
HEADLINE_END = "<!-- /bench.render: headline -->"
LEVEL = 0.05  # ratios within 5% of 1 read as a tie: the bench's own machines drift by more than that
REQUIRED = ("capability", "title", "command", "machine", "date", "commit", "source", "columns", "rows")

INTRO = """# Benchmarks

The current figures, one table per capability, rendered by `python -m bench.render` from the result records
in [bench/results/](bench/results/) (do not edit this page by hand: a test checks that it equals the rendering).
Each table says the command, the machine, the date and the commit, and where its numbers come from: a raw
result file, or the report of the session that measured them when that report is the only record.

How to read a comparison: **ratio** is ours over the other column for a rate (higher is better) and the other
column over ours for a time or a size (lower is better), so above 1 always means ours is better. **Spread** is
the lowest and highest ratio over the rounds; the medians of each column are over the same rounds. **Reading**
calls a round within 5% of 1 a tie: "ahead" or "behind" only when every round is, "rounds disagree" otherwise.
The machines are shared VMs whose speed moves by more than that between runs, so a lead of a few percent is
not a result. Timed figures on 2-vCPU machines are not comparable across machines; ratios measured in one run are.

Commands are written with today's module names (`python -m bench` was `python -m inference.bench`, and
`python -m bench.serving` was `python manage.py bench_ws`). To add a result, see `bench/render.py`: save the run
with `--out bench/results/raw/...`, add a record pointing at it, re-render. What was tried and dropped, and why:
[docs/performance-notes.md](docs/performance-notes.md). Every bench: `python -m bench --help`,
`python -m bench.gpu_suite --help`, `python -m bench.serving --help`,
`python -m bench.serve_vs_vllm --help`, `python -m bench.serve_cpu --help`, `python -m bench.request_timeline --help`; the peers: `bash bench/peers/setup_vllm.sh`,
`bash bench/peers/setup_llamacpp.sh`.
"""


@dataclass(frozen=True)
class Row:
    """One figure of a record: its name, unit, which way is better, and its value in every round."""

    figure: str
    unit: str
    higher_is_better: bool
    rounds: list[list[float]]
    headline: bool = False

    def ratios(self) -> list[float]:
        """Per round, how many times better ours is (first column against the second)."""
        return [ours / other if self.higher_is_better else other / ours for ours, other in self.rounds]


def load_records(results: Path = RESULTS) -> list[dict[str, Any]]:
    """Every record under `results`, in file-name order, checked; a missing field is refused by name."""
    records = []
    for path in sorted(results.glob("*.json")):
        record = json.loads(path.read_text())
        missing = [key for key in REQUIRED if key not in record]
        if missing:
            raise ValueError(f"{path.name}: missing {', '.join(missing)}")
        if len(record["columns"]) not in (1, 2):
            raise ValueError(f"{path.name}: columns must name one value or a pair (ours, other)")
        record["rows"] = [_row(path, record, row) for row in record["rows"]]
        records.append(record)
    return records


def _row(path: Path, record: dict[str, Any], row: dict[str, Any]) -> Row:
    width = len(record["columns"])
    if "better" not in row or row["better"] not in ("higher", "lower"):
        raise ValueError(f"{path.name}: row {row.get('figure')!r} needs better: higher or lower")
    if "raw" in record:
        rounds = []
        for raw in record["raw"]:
            result = json.loads((REPO / raw).read_text())
            try:
                columns = [_lookup(result, dotted) for dotted in row["paths"]]
            except (KeyError, IndexError, TypeError) as exc:
                raise ValueError(f"{path.name}: {raw} has no {exc} for row {row['figure']!r}") from exc
            if len({len(column) for column in columns}) > 1:
                raise ValueError(f"{path.name}: row {row['figure']!r}: its paths give different numbers of rounds")
            rounds += [list(values) for values in zip(*columns)]
    else:
        rounds = row.get("rounds", [])
    rounds = [[float(v) for v in values] if isinstance(values, list) else [float(values)] for values in rounds]
    if not rounds or any(len(values) != width for values in rounds):
        raise ValueError(f"{path.name}: row {row['figure']!r} needs {width} value(s) in every round")
    return Row(row["figure"], row.get("unit", ""), row["better"] == "higher", rounds, row.get("headline", False))


def _lookup(result: Any, dotted: str) -> list[float]:
    """The values at a dotted path of a raw result; a `*` step fans out over a list (one value per round, as in
    `vs_vllm.rounds.*.ours.chat.output_tokens_per_s`)."""
    key, _, rest = dotted.partition(".")
    items = result if key == "*" else [result[key]]
    if not rest:
        return list(items)
    return [value for item in items for value in _lookup(item, rest)]


def reading(ratios: list[float]) -> str:
    """ahead / behind / tied when every round agrees (a round within LEVEL of 1 is a tie); else disagree."""
    kinds = {"ahead" if r > 1 + LEVEL else "behind" if r < 1 - LEVEL else "tied (within 5%)" for r in ratios}
    if len(kinds) > 1:
        return "rounds disagree"
    kind = kinds.pop()
    if len(ratios) == 1:
        return f"{kind}, one round"
    return f"{kind} in every round"


def number(value: float) -> str:
    """Three significant figures at least, thousands separated, whole numbers as such: 0.275, 41.3, 93, 4,893."""
    if value == int(value):
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.1f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def render_table(record: dict[str, Any]) -> list[str]:
    columns = record["columns"]
    lines = [f"### {record['title']}", "",
             f"- command: `{record['command']}`",
             f"- machine: {record['machine']}",
             f"- date: {record['date']}; commit: `{record['commit']}`",
             f"- source: {record['source']}"]
    if record.get("note"):
        lines.append(f"- note: {record['note']}")
    lines.append("")
    if len(columns) == 2:
        lines += [f"| figure | {columns[0]} | {columns[1]} | ratio | spread | rounds | reading |",
                  "|---|---|---|---|---|---|---|"]
        for row in record["rows"]:
            ratios = row.ratios()
            ours = statistics.median(values[0] for values in row.rounds)
            other = statistics.median(values[1] for values in row.rounds)
            unit = f" {row.unit}" if row.unit else ""
            lines.append(f"| {row.figure} | {number(ours)}{unit} | {number(other)}{unit} | "
                         f"**{statistics.median(ratios):.2f}x** | {min(ratios):.2f}–{max(ratios):.2f}x | "
                         f"{len(ratios)} | {reading(ratios)} |")
    else:
        lines += ["| figure | median | spread | rounds |", "|---|---|---|---|"]
        for row in record["rows"]:
            values = [v[0] for v in row.rounds]
            unit = f" {row.unit}" if row.unit else ""
            lines.append(f"| {row.figure} | **{number(statistics.median(values))}{unit}** | "
                         f"{number(min(values))}–{number(max(values))} | {len(values)} |")
    return lines


def render_page(records: list[dict[str, Any]]) -> str:
    lines = INTRO.rstrip("\n").splitlines()
    capability = None
    for record in records:
        if record["capability"] != capability:
            capability = record["capability"]
            lines += ["", f"## {capability}"]
        lines += ["", *render_table(record)]
    return "\n".join(lines) + "\n"


def render_headline(records: list[dict[str, Any]]) -> str:
    """README's headline: one line per row a record marks `headline`, with its spread and where it was measured."""
    lines = [HEADLINE_START]
    for record in records:
        for row in (row for row in record["rows"] if row.headline):
            where = f"{record['machine'].split(' (')[0].split(',')[0]}, {record['date'][:10]}"
            if len(record["columns"]) == 1:
                values = [v[0] for v in row.rounds]
                unit = f" {row.unit}" if row.unit else ""
                lines.append(f"- {record['title']}, {row.figure}: **{number(statistics.median(values))}{unit}**, "
                             f"median of {len(values)} ({where})")
                continue
            ratios = row.ratios()
            spread = "" if len(ratios) == 1 else f"median, {min(ratios):.2f}–{max(ratios):.2f}x over the rounds, "
            lines.append(f"- {record['title']}, {row.figure}: **{statistics.median(ratios):.2f}x** {spread}"
                         f"{reading(ratios)} ({where})")
    lines += ["", "Every table, with its command, machine and commit: [BENCHMARKS.md](BENCHMARKS.md).", HEADLINE_END]
    return "\n".join(lines)


def with_headline(readme: str, headline: str) -> str:
    """README with its headline block replaced; the markers must be there, once each."""
    if readme.count(HEADLINE_START) != 1 or readme.count(HEADLINE_END) != 1:
        raise ValueError("README.md must hold the headline markers once each")
    before, rest = readme.split(HEADLINE_START)
    _, after = rest.split(HEADLINE_END)
    return before + headline + after


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.render", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page differs from its rendering")
    args = parser.parse_args(argv)
    records = load_records()
    pages = {PAGE: render_page(records), README: with_headline(README.read_text(), render_headline(records))}
    stale = [path.name for path, text in pages.items() if path.read_text() != text]
    if args.check:
        if stale:
            print(f"out of date: {', '.join(stale)} (run python -m bench.render)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in pages.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
