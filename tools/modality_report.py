#!/usr/bin/env python3
"""Drift report of a mixed-modality `qknorm sweep` (experiment 9): how the norms, the logits and
log Z of each run moved, split by modality.

Usage: tools/modality_report.py SWEEP_DIR [--csv OUT] [--window STEPS]

A run directory is named `<variant>[_img-<f>_ient-<bits>]__lr<lr>__s<seed>` (the data: "text"
when there is no image, else "img<bits>"). Per run, from the `modality` objects of metrics.jsonl
(docs/modalities.md#signals-by-modality), each value the mean over the first and the last
--window (10) signal steps, "start" and "end":
- the final validation loss, and its split by the target's modality;
- ‖q‖ and ‖k‖ before the QK-norm by the position's modality (mean over layers): end, the growth
  end / start, and the late growth end / middle (the --window signal steps before the run's
  midpoint): q and k start near 0 (weights of std 0.02) and grow fastest in the first hundred
  steps, so end / start mostly measures that first rise, and end / middle whether they still grow;
- max |s| by query > key modality (max over layers): end, and the largest over the run;
- log Z by the target's modality: end, its drift end − start and its late drift end − middle
  (log Z starts at log V and jumps in the first steps: the late drift is the slow one);
- the QK-norm gains max |g| (max over layers and q/k), end.
Standard library only.
"""
import argparse
import json
import math
import os
import re
import sys

from sweep_runs import runs, write_csv

RUN_NAME = re.compile(r"^(?P<variant>.+?)(?:_img-(?P<img>[0-9.]+)_ient-(?P<ient>[0-9.]+))?"
                      r"__lr(?P<lr>[^_]+)__s(?P<seed>\d+)$")
MODALITIES = ("text", "image")
PAIRS = ("text>text", "text>image", "image>text", "image>image")


def mean(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def series(path):
    """Per signal step: the values the report reads, and the last validation split."""
    steps, val, val_split = [], None, {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if "val_loss" in row:
                val = row["val_loss"]
                val_split = row.get("val_loss_by_modality", {})
            m = row.get("modality")
            if not m:
                continue
            layers = m.get("layers", [])
            point = {}
            for mod in MODALITIES:
                for key in ("q_norm", "k_norm"):
                    point[f"{key[0]}_{mod}"] = mean([l[key][mod] for l in layers])
                point[f"log_z_{mod}"] = m["log_z"][mod]
            for pair in PAIRS:
                found = [l["max_logit"][pair] for l in layers if l["max_logit"][pair] is not None]
                point[pair] = max(found) if found else None
            gains = [l[k] for l in layers for k in ("q_gain", "k_gain") if l[k] is not None]
            point["gain"] = max(gains) if gains else None
            steps.append(point)
    return steps, val, val_split


def ratio(a, b):
    return a / b if a is not None and b else None


def difference(a, b):
    return a - b if a is not None and b is not None else None


def run_row(run_dir, match, window):
    steps, val, split = series(os.path.join(run_dir, "metrics.jsonl"))
    if not steps:
        return None
    middle_at = max(len(steps) // 2 - window, 0)
    head, middle, tail = steps[:window], steps[middle_at:middle_at + window], steps[-window:]
    start = {k: mean([p[k] for p in head]) for k in head[0]}
    mid = {k: mean([p[k] for p in middle]) for k in middle[0]}
    end = {k: mean([p[k] for p in tail]) for k in tail[0]}
    data = "text" if match["img"] is None else f"img{match['ient']}"
    row = {"variant": match["variant"], "data": data, "lr": float(match["lr"]),
           "seed": int(match["seed"]), "val_loss": val,
           "val_text": split.get("text"), "val_image": split.get("image")}
    for mod in MODALITIES:
        for which in ("q", "k"):
            key = f"{which}_{mod}"
            row[f"{key}_end"] = end[key]
            row[f"{key}_growth"] = ratio(end[key], start[key])
            row[f"{key}_late_growth"] = ratio(end[key], mid[key])
        log_z = f"log_z_{mod}"
        row[f"{log_z}_end"] = end[log_z]
        row[f"{log_z}_drift"] = difference(end[log_z], start[log_z])
        row[f"{log_z}_late_drift"] = difference(end[log_z], mid[log_z])
    for pair in PAIRS:
        row[f"max_s_{pair}_end"] = end[pair]
        over_run = [p[pair] for p in steps if p[pair] is not None]
        row[f"max_s_{pair}_peak"] = max(over_run) if over_run else None
    row["gain_end"] = end["gain"]
    return row


def fmt(v, spec=".3g"):
    return "-" if v is None else format(v, spec)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--csv", help="write the per-run table here")
    parser.add_argument("--window", type=int, default=10,
                        help="signal steps averaged at the start, the middle and the end (10)")
    args = parser.parse_args()
    rows = [row for match, run_dir in runs(args.sweep_dir, "modality_report", RUN_NAME)
            if (row := run_row(run_dir, match, args.window))]
    if not rows:
        sys.exit(f"modality_report: no finished run with modality signals in {args.sweep_dir}/runs")
    rows.sort(key=lambda r: (r["variant"], r["data"], r["lr"], r["seed"]))
    print(f"{'variant':<24}{'data':<8}{'lr':>7}{'s':>3}{'val':>7}{'val img':>8}"
          f"{'|q| txt':>8}{'|q| img':>8}{'late x':>7}{'late x':>7}"
          f"{'peak s t>t':>11}{'peak s i>i':>11}{'logZ txt':>9}{'late +':>7}{'logZ img':>9}"
          f"{'late +':>7}{'max|g|':>7}")
    for r in rows:
        print(f"{r['variant']:<24}{r['data']:<8}{r['lr']:>7g}{r['seed']:>3}"
              f"{fmt(r['val_loss'], '.3f'):>7}{fmt(r['val_image'], '.3f'):>8}"
              f"{fmt(r['q_text_end']):>8}{fmt(r['q_image_end']):>8}"
              f"{fmt(r['q_text_late_growth']):>7}{fmt(r['q_image_late_growth']):>7}"
              f"{fmt(r['max_s_text>text_peak']):>11}{fmt(r['max_s_image>image_peak']):>11}"
              f"{fmt(r['log_z_text_end']):>9}{fmt(r['log_z_text_late_drift'], '.2f'):>7}"
              f"{fmt(r['log_z_image_end']):>9}{fmt(r['log_z_image_late_drift'], '.2f'):>7}"
              f"{fmt(r['gain_end']):>7}")
    if args.csv:
        write_csv(args.csv, rows)


if __name__ == "__main__":
    main()
