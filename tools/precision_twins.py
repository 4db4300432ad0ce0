#!/usr/bin/env python3
"""Pairs each low-precision run of a `qknorm sweep` with its float32 twin and says where they part.

Usage: tools/precision_twins.py SWEEP_DIR [--precision P] [--threshold NATS] [--window STEPS]
                                [--csv OUT]

A bf16 run is a variant with the override `precision=bf16` (run directory
`<variant>_precision-bf16__lr<lr>__s<seed>`), and so on for --precision fp16, fp8 and fp8+attn
(`<variant>_precision-fp8_fp8attn-1__...`); its twin is `<variant>__lr<lr>__s<seed>`: same
seed, same batches, same initial weights, so every difference in their training losses comes from
the precision. The training loss is compared in windows of --window steps (mean of low − fp32);
"departs at" is the first window from which that mean stays beyond ±threshold to the end of the
run (a transient gap that closes again is not a departure). Also printed: each twin's final
validation loss and largest max |attention logit| over the run. Standard library only.
"""
import argparse
import json
import os
import sys

from sweep_runs import PRECISION_RUN, precision_label, runs, write_csv


def load_run(path):
    """Training loss per step, final val loss, largest max |s| over layers and steps."""
    losses, val, max_logit = {}, None, 0.0
    with open(os.path.join(path, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if "loss" in row:
                losses[row["step"]] = row["loss"]
            if "val_loss" in row:
                val = row["val_loss"]
            for layer in row.get("layers", []):
                max_logit = max(max_logit, layer["max_logit"])
    return losses, val, max_logit


def departure(fp32, low, threshold, window):
    """First step of the window from which |mean(low - fp32)| stays above threshold, or None."""
    steps = sorted(set(fp32) & set(low))
    means = []
    for i in range(0, len(steps) - window + 1, window):
        chunk = steps[i:i + window]
        means.append((chunk[0], sum(low[s] - fp32[s] for s in chunk) / window))
    for i, (step, _) in enumerate(means):
        if all(abs(m) > threshold for _, m in means[i:]):
            return step, means
    return None, means


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--precision", default="bf16", help="bf16 (default), fp16, fp8, fp8+attn")
    parser.add_argument("--threshold", type=float, default=0.02)
    parser.add_argument("--window", type=int, default=50)
    parser.add_argument("--csv", help="also write the table here")
    args = parser.parse_args()
    rows = []
    for match, run_dir in runs(args.sweep_dir, "precision_twins", PRECISION_RUN, finished=False):
        if precision_label(match) != args.precision:
            continue
        name = os.path.basename(run_dir)
        twin = f"{match['variant']}__lr{match['lr']}__s{match['seed']}"
        twin_dir = os.path.join(os.path.dirname(run_dir), twin)
        if not os.path.isdir(twin_dir):
            print(f"precision_twins: {name} has no float32 twin {twin}; skipped", file=sys.stderr)
            continue
        fp32, val32, logit32 = load_run(twin_dir)
        low, val_low, logit_low = load_run(run_dir)
        step, _ = departure(fp32, low, args.threshold, args.window)
        rows.append({"variant": match["variant"], "lr": float(match["lr"]),
                     "seed": int(match["seed"]), "val_fp32": val32, "val_low": val_low,
                     "val_diff": val_low - val32, "max_logit_fp32": logit32,
                     "max_logit_low": logit_low, "departs_at": "" if step is None else step})
    rows.sort(key=lambda r: (r["variant"], r["lr"], r["seed"]))

    low = args.precision
    print(f"{'variant':<18}{'lr':>7}{'val fp32':>10}{'val ' + low:>13}{low + '-fp32':>14}"
          f"{'max|s| fp32':>13}{'max|s| ' + low:>16}  departs at (|mean gap| > {args.threshold})")
    for r in rows:
        print(f"{r['variant']:<18}{r['lr']:>7g}{r['val_fp32']:>10.4f}{r['val_low']:>13.4f}"
              f"{r['val_diff']:>+14.4f}{r['max_logit_fp32']:>13.4g}{r['max_logit_low']:>16.4g}"
              f"  {r['departs_at'] if r['departs_at'] != '' else '-'}")
    if args.csv:
        write_csv(args.csv, rows)


if __name__ == "__main__":
    main()
