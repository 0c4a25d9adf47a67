#!/usr/bin/env python3
"""Draws the charts of docs/performance.md from its own tables (standard library only).

    python3 scripts/perf_charts.py          # rewrites docs/img/*.svg

- docs/img/webhook-latency-vs-rate.svg: p50 and p99 of /validate against the request
  rate, from the table under "## Budget-gate webhook".
- docs/img/controller-memory-vs-pods.svg: the controller's peak and steady RSS against
  the pods in the cluster, from the table under "## Controller at scale".

Edit the tables (rerun the harnesses), then rerun this script: the charts follow.
"""

import math
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "performance.md")
OUT = os.path.join(ROOT, "docs", "img")


def table_after(text, heading):
    """The first Markdown table after `heading`: (header cells, rows of cells)."""
    start = text.index(heading)
    lines = text[start:].splitlines()
    rows = []
    for line in lines[1:]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    if len(rows) < 3:
        sys.exit(f"no table under {heading!r} in {DOC}")
    return rows[0], rows[2:]


def number(cell):
    """The first number in a cell: '**0.679**' → 0.679, '50,000' → 50000, '93 MiB' → 93."""
    m = re.search(r"-?[\d,]*\.?\d+", cell.replace("*", ""))
    if not m:
        raise ValueError(f"no number in {cell!r}")
    return float(m.group(0).replace(",", ""))


def column(header, rows, name):
    for i, h in enumerate(header):
        if h.lower().startswith(name.lower()):
            return [number(r[i]) for r in rows]
    sys.exit(f"no column {name!r} in {header}")


def nice_max(v):
    """A round axis end at or above v."""
    if v <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for step in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if step * exp >= v:
            return step * exp
    return 10 * exp


def fmt(v):
    if v >= 1000:
        return f"{v:,.0f}"
    if v == int(v):
        return f"{v:.0f}"
    return f"{v:g}"


def line_chart(title, x_label, y_label, xs, series, note="", y_limit=None):
    """An SVG line chart; `series` is [(name, colour, ys)], `y_limit` an optional
    (value, label) drawn as a dashed line."""
    width, height = 640, 400
    left, right, top, bottom = 70, 20, 50, 60
    pw, ph = width - left - right, height - top - bottom
    x_max = nice_max(max(xs))
    y_top = max(max(ys) for _, _, ys in series)
    if y_limit:
        y_top = max(y_top, y_limit[0])
    y_max = nice_max(y_top * 1.1)

    def px(x):
        return left + pw * x / x_max

    def py(y):
        return top + ph * (1 - y / y_max)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{title}</text>',
    ]
    for i in range(6):
        y = y_max * i / 5
        out.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{left + pw}" y2="{py(y):.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{fmt(round(y, 6))}</text>')
    for i in range(6):
        x = x_max * i / 5
        out.append(f'<line x1="{px(x):.1f}" y1="{top + ph}" x2="{px(x):.1f}" y2="{top + ph + 5}" stroke="#333"/>')
        out.append(f'<text x="{px(x):.1f}" y="{top + ph + 18}" text-anchor="middle">{fmt(round(x, 6))}</text>')
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#333"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#333"/>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 18}" text-anchor="middle">{x_label}</text>')
    out.append(
        f'<text x="16" y="{top + ph / 2}" text-anchor="middle" transform="rotate(-90 16 {top + ph / 2})">{y_label}</text>'
    )
    if y_limit:
        value, label = y_limit
        out.append(
            f'<line x1="{left}" y1="{py(value):.1f}" x2="{left + pw}" y2="{py(value):.1f}" '
            'stroke="#c0392b" stroke-dasharray="6 4"/>'
        )
        out.append(f'<text x="{left + pw - 4}" y="{py(value) - 6:.1f}" text-anchor="end" fill="#c0392b">{label}</text>')
    for n, (name, colour, ys) in enumerate(series):
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys))
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in zip(xs, ys):
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{colour}"><title>{fmt(x)}: {y:g}</title></circle>')
        ly = top + 8 + 18 * n
        out.append(f'<line x1="{left + 12}" y1="{ly}" x2="{left + 36}" y2="{ly}" stroke="{colour}" stroke-width="2"/>')
        out.append(f'<text x="{left + 42}" y="{ly + 4}">{name}</text>')
    if note:
        out.append(f'<text x="{width - right}" y="{height - 4}" text-anchor="end" font-size="10" fill="#666">{note}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    text = open(DOC, encoding="utf-8").read()
    os.makedirs(OUT, exist_ok=True)

    header, rows = table_after(text, "## Budget-gate webhook")
    rates = column(header, rows, "rate")
    chart = line_chart(
        "Budget-gate webhook: latency vs request rate",
        "requests per second (open loop, TLS, 8 connections)",
        "latency (ms)",
        rates,
        [
            ("p50", "#2471a3", column(header, rows, "p50")),
            ("p99", "#d35400", column(header, rows, "p99 (ms)")),
            ("p99 from due time", "#7d3c98", column(header, rows, "p99 from due")),
        ],
        note="cargo run --release --example webhook_load · docs/performance.md",
        y_limit=(2.0, "target: p99 ≤ 2 ms at 2,000 req/s"),
    )
    with open(os.path.join(OUT, "webhook-latency-vs-rate.svg"), "w", encoding="utf-8") as f:
        f.write(chart)

    header, rows = table_after(text, "## Controller at scale")
    pods = column(header, rows, "pods")
    chart = line_chart(
        "Controller memory vs pods in the cluster (20 % on GPUs)",
        "pods in the cluster",
        "controller RSS (MiB)",
        pods,
        [
            ("peak RSS", "#d35400", column(header, rows, "peak RSS")),
            ("steady RSS", "#2471a3", column(header, rows, "steady RSS")),
        ],
        note="cargo run --release --example controller_scale · docs/performance.md",
        y_limit=(150.0, "target: ≤ 150 MiB at 50,000 pods"),
    )
    with open(os.path.join(OUT, "controller-memory-vs-pods.svg"), "w", encoding="utf-8") as f:
        f.write(chart)
    print(f"wrote {OUT}/webhook-latency-vs-rate.svg and controller-memory-vs-pods.svg")


if __name__ == "__main__":
    main()
