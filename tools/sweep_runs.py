"""What the stability lab's report scripts share (precision_twins.py, low_precision_report.py,
modality_report.py): the runs of a `qknorm sweep` output directory, the precision a run's
directory name says, and writing a table. Standard library only.
"""
import csv
import os
import re
import sys

# `<variant>[_precision-<p>][_fp8attn-1]__lr<lr>__s<seed>`, the variant holding any other
# override (`baseline_clip-100`).
PRECISION_RUN = re.compile(r"^(?P<variant>.+?)(?:_precision-(?P<precision>[a-z0-9]+))?"
                           r"(?P<fp8attn>_fp8attn-1)?__lr(?P<lr>[^_]+)__s(?P<seed>\d+)$")


def precision_label(match):
    """fp32, bf16, fp16, fp8 or fp8+attn, from a PRECISION_RUN match."""
    precision = match["precision"] or "fp32"
    return precision + "+attn" if match["fp8attn"] else precision


def runs(sweep_dir, tool, pattern, finished=True):
    """(match, run directory) for each run directory whose name matches pattern, in name order;
    with finished, only the runs that wrote their result.json. Exits naming the tool when
    sweep_dir is not a sweep's output."""
    runs_dir = os.path.join(sweep_dir, "runs")
    if not os.path.isdir(runs_dir):
        sys.exit(f"{tool}: {runs_dir} is not a directory (expected a qknorm sweep's output)")
    for name in sorted(os.listdir(runs_dir)):
        match = pattern.match(name)
        run_dir = os.path.join(runs_dir, name)
        if match and (not finished or os.path.exists(os.path.join(run_dir, "result.json"))):
            yield match, run_dir


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["variant"])
        writer.writeheader()
        writer.writerows(rows)
