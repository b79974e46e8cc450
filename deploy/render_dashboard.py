#!/usr/bin/env python3
"""Renders the Grafana dashboard's panels as one PNG, from a real Prometheus, where Grafana
itself cannot run: each panel's queries (variables set to every instance and model) are asked
with /api/v1/query_range over the data Prometheus holds, and plotted with matplotlib.

Usage: python3 deploy/render_dashboard.py PROMETHEUS_URL OUT.png   (needs matplotlib)
tests/it/dashboard.rs runs it on its own traffic when CONDENSER_DASHBOARD_PNG names the output.
"""
import json
import math
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DASHBOARD = Path(__file__).resolve().parent / "grafana" / "condenser.json"
# As tests/it/dashboard.rs substitutes them.
SUBSTITUTIONS = {
    "$__rate_interval": "30s",
    "$__range": "5m",
    "$instance": ".*",
    "$model": ".*",
}


def query_range(prometheus, expr, start, end):
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1s"})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}") as reply:
        body = json.load(reply)
    if body.get("status") != "success":
        raise SystemExit(f"{expr}: {body}")
    return body["data"]["result"]


def legend(template, labels):
    text = template
    for name, value in labels.items():
        text = text.replace("{{" + name + "}}", value)
    return text


def main():
    prometheus, out = sys.argv[1].rstrip("/"), sys.argv[2]
    dashboard = json.loads(DASHBOARD.read_text())
    end = time.time()
    start = end - 120
    panels = dashboard["panels"]
    rows = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(14, 3.2 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        ax.set_title(panel["title"], fontsize=10, loc="left")
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in SUBSTITUTIONS.items():
                expr = expr.replace(variable, value)
            for series in query_range(prometheus, expr, start, end):
                points = [(float(t), float(v)) for t, v in series["values"] if v not in ("NaN", "+Inf", "-Inf")]
                if points:
                    xs = [t - end for t, _ in points]
                    ax.plot(xs, [v for _, v in points], label=legend(target["legendFormat"], series["metric"]))
        ax.set_xlabel("seconds before render", fontsize=8)
        ax.set_ylabel(panel["fieldConfig"]["defaults"]["unit"], fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.suptitle("condenser (deploy/grafana/condenser.json), from tests/it/dashboard.rs's traffic", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out, dpi=80)


if __name__ == "__main__":
    main()
