#!/usr/bin/env python3
"""Overflow report of a low-precision `qknorm sweep` (experiment 8): per run, when and where the
format overflowed, and how far the QK-norm gains drifted.

Usage: tools/low_precision_report.py SWEEP_DIR [--runs-csv OUT] [--summary-csv OUT]

A run directory is named `<variant>[_precision-<p>][_fp8attn-1]__lr<lr>__s<seed>`; the label
`fp32`, `bf16`, `fp16`, `fp8` or `fp8+attn` is read from it. Per run (--runs-csv):
- the final validation loss, whether the run diverged (result.json: a non-finite loss or one past
  --diverge-factor; its loss then counts as the initial one) and the largest max |s| (attention logit, pre-cap) over the run;
- `first_over_fp16` / `first_over_e4m3`: the first step whose max |s| exceeds 65,504 (float16's
  largest finite value: an fp16 logits GEMM, as an unfused attention in PyTorch AMP computes it,
  would hold an Inf) and 448 (E4M3's: FP8 logits saturate there);
- fp16: the skipped steps, the first one, the smallest loss scale used;
- fp8: per tensor kind (x, weight, grad; q, k, logits with --fp8-attention), the first step with a
  value at the format's largest value, and how many such values in the whole run;
- QK-norm runs: the final gains of layer 0 and 1 from the last checkpoint, as max |g_q| · max |g_k|
  · √D, the bound on |s| that RMS- or Layer-normalised q and k without biases allow (|N(x)|₂ = √D);
  it is √D ≈ 5.66 at initialisation (D = 32), and E4M3's 448 needs it 79× larger.
Per variant and precision (--summary-csv): the best final validation loss over the LR grid (mean
over seeds), its LR, Wortsman et al.'s LR sensitivity (mean over LRs of min(loss, initial loss)
minus the best), and the `usable` LRs: those whose mean loss is within --usable NATS (0.1) of the
best loss of the variant's float32 runs. Standard library only.
"""
import argparse
import json
import math
import os
import struct
import sys
from collections import defaultdict

from sweep_runs import PRECISION_RUN, precision_label, runs, write_csv

FP16_MAX, E4M3_MAX = 65504.0, 448.0
FP8_KINDS = ("x", "weight", "grad", "q", "k", "logits")


def first_step(events):
    return min(events) if events else ""


def read_metrics(path):
    """One pass over metrics.jsonl: everything the report needs from it."""
    run = {"val": None, "init_val": None, "max_logit": 0.0, "over_fp16": [], "over_e4m3": [],
           "skipped": [], "min_scale": math.inf, "saturated_at": defaultdict(list),
           "saturated": defaultdict(int), "diverged": False}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            step = row.get("step", 0)
            if "val_loss" in row:
                run["val"] = row["val_loss"]
                if run["init_val"] is None:
                    run["init_val"] = row["val_loss"]
            loss = row.get("loss")
            if loss is not None and not math.isfinite(loss):
                run["diverged"] = True
            layer_max = max((layer["max_logit"] for layer in row.get("layers", [])), default=0.0)
            run["max_logit"] = max(run["max_logit"], layer_max)
            if layer_max > FP16_MAX:
                run["over_fp16"].append(step)
            if layer_max > E4M3_MAX:
                run["over_e4m3"].append(step)
            if row.get("skipped"):
                run["skipped"].append(step)
            if "loss_scale" in row:
                run["min_scale"] = min(run["min_scale"], row["loss_scale"])
            for layer in row.get("fp8_saturated", []):
                for kind in FP8_KINDS:
                    value = layer.get(kind, 0)
                    count = sum(value) if isinstance(value, list) else value
                    if count:
                        run["saturated_at"][kind].append(step)
                        run["saturated"][kind] += count
    return run


def read_safetensors(path, wanted):
    """The float32 tensors named in `wanted` from a safetensors file, as flat lists."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        base = 8 + header_len
        tensors = {}
        for name in wanted:
            entry = header.get(name)
            if entry is None or entry["dtype"] != "F32":
                continue
            begin, end = entry["data_offsets"]
            f.seek(base + begin)
            tensors[name] = list(struct.unpack(f"<{(end - begin) // 4}f", f.read(end - begin)))
    return tensors


def gain_bounds(run_dir, n_layer, head_dim):
    """√D · max|g_q| · max|g_k| per layer from the run's last checkpoint, or [] without gains."""
    models = sorted(n for n in os.listdir(run_dir) if n.endswith(".model.safetensors"))
    if not models:
        return []
    names = [f"transformer.h.{i}.attn.{which}_norm.weight"
             for i in range(n_layer) for which in ("q", "k")]
    tensors = read_safetensors(os.path.join(run_dir, models[-1]), names)
    bounds = []
    for i in range(n_layer):
        q = tensors.get(f"transformer.h.{i}.attn.q_norm.weight")
        k = tensors.get(f"transformer.h.{i}.attn.k_norm.weight")
        if q is None or k is None:
            return []
        bounds.append(math.sqrt(head_dim) * max(map(abs, q)) * max(map(abs, k)))
    return bounds


def run_row(run_dir, match):
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    model = config.get("model", config)
    n_layer, n_head, n_embd = model["n_layer"], model["n_head"], model["n_embd"]
    m = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    with open(os.path.join(run_dir, "result.json")) as f:
        result = json.load(f)  # diverged: a non-finite loss or one past --diverge-factor
    bounds = gain_bounds(run_dir, n_layer, n_embd // n_head)
    row = {"variant": match["variant"], "precision": precision_label(match),
           "lr": float(match["lr"]), "seed": int(match["seed"]), "init_val_loss": m["init_val"],
           "final_val_loss": m["val"],
           "diverged": int(m["diverged"] or result.get("diverged", False)),
           "steps_done": result.get("steps_done", ""),
           "max_logit": m["max_logit"], "first_over_fp16": first_step(m["over_fp16"]),
           "first_over_e4m3": first_step(m["over_e4m3"]), "skipped_steps": len(m["skipped"]),
           "first_skipped": first_step(m["skipped"]),
           "min_loss_scale": "" if math.isinf(m["min_scale"]) else m["min_scale"]}
    for kind in FP8_KINDS:
        row[f"first_saturated_{kind}"] = first_step(m["saturated_at"][kind])
        row[f"saturated_{kind}"] = m["saturated"][kind] if m["saturated_at"][kind] else ""
    for i in range(n_layer):
        row[f"gain_bound_l{i}"] = round(bounds[i], 3) if bounds else ""
    return row


def summarise(rows, usable_margin):
    """Per (variant, precision): best mean loss, its LR, LR sensitivity, usable LRs."""
    losses = defaultdict(lambda: defaultdict(list))
    init = {}
    for r in rows:
        if r["final_val_loss"] is not None:
            loss = r["final_val_loss"] if not r["diverged"] else r["init_val_loss"]
            losses[(r["variant"], r["precision"])][r["lr"]].append(loss)
            init[(r["variant"], r["precision"])] = r["init_val_loss"]
    means = {key: {lr: sum(v) / len(v) for lr, v in by_lr.items()} for key, by_lr in losses.items()}
    summary = []
    for (variant, precision), by_lr in sorted(means.items()):
        best_lr = min(by_lr, key=by_lr.get)
        best = by_lr[best_lr]
        sensitivity = sum(min(l, init[(variant, precision)]) - best
                          for l in by_lr.values()) / len(by_lr)
        reference = min(means.get((variant, "fp32"), by_lr).values())
        usable = sorted(lr for lr, l in by_lr.items() if l <= reference + usable_margin)
        summary.append({"variant": variant, "precision": precision, "best_loss": round(best, 4),
                        "best_lr": best_lr, "lr_sensitivity": round(sensitivity, 4),
                        "usable_lrs": " ".join(f"{lr:g}" for lr in usable),
                        "max_usable_lr": max(usable) if usable else "",
                        "seeds": max(len(v) for v in losses[(variant, precision)].values())})
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--runs-csv", help="write the per-run table here")
    parser.add_argument("--summary-csv", help="write the per-variant table here")
    parser.add_argument("--usable", type=float, default=0.1,
                        help="an LR is usable within this many nats of the fp32 best (0.1)")
    args = parser.parse_args()
    rows = [run_row(run_dir, match)
            for match, run_dir in runs(args.sweep_dir, "low_precision_report", PRECISION_RUN)]
    if not rows:
        sys.exit(f"low_precision_report: no finished run in {args.sweep_dir}/runs")
    rows.sort(key=lambda r: (r["variant"], r["precision"], r["lr"], r["seed"]))
    summary = summarise(rows, args.usable)

    print(f"{'variant':<18}{'precision':<10}{'best':>7}{'at lr':>7}{'LR sens.':>9}  usable LRs")
    for s in summary:
        print(f"{s['variant']:<18}{s['precision']:<10}{s['best_loss']:>7.3f}{s['best_lr']:>7g}"
              f"{s['lr_sensitivity']:>9.3f}  {s['usable_lrs']}")
    if args.runs_csv:
        write_csv(args.runs_csv, rows)
    if args.summary_csv:
        write_csv(args.summary_csv, summary)


if __name__ == "__main__":
    main()
