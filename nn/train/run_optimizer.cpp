#include "nn/train/run_optimizer.h"

#include <cmath>

#include "core/distributed.h"
#include "core/error.h"

namespace qk::nn {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// No NaN or Inf in any of the tensors (a checkpoint is never written from such weights).
bool finite(const std::vector<Tensor>& tensors) {
    for (const Tensor& t : tensors) {
        bool ok = true;
        const Tensor c = t.to(Device::cpu).contiguous();
        dispatch_float(c.dtype(), [&](auto tag) {
            const auto* data = c.data<decltype(tag)>();
            for (int64_t i = 0; i < c.numel() && ok; ++i) ok = std::isfinite(data[i]);
        });
        if (!ok) return false;
    }
    return true;
}

// AdamW's moments by name: m then v per parameter, as AdamW::state() lists them.
void append_adamw_state(OptimizerState& out, const std::vector<std::string>& names,
                        const std::vector<Tensor>& moments) {
    for (size_t i = 0; i < names.size(); ++i) {
        out.tensors.emplace_back("exp_avg." + names[i], moments[2 * i]);
        out.tensors.emplace_back("exp_avg_sq." + names[i], moments[2 * i + 1]);
    }
}

}  // namespace

ParameterSplit split_for_muon(const std::vector<std::pair<std::string, Tensor>>& named_params,
                              AttnRows attn_rows) {
    ParameterSplit split;
    for (const auto& [name, p] : named_params) {
        if (p.dim() != 2 || name.rfind("transformer.h.", 0) != 0) {
            split.adamw.emplace_back(name, p);
        } else if (ends_with(name, ".c_attn.weight")) {
            // The q, k and v projections, each orthogonalised on its own.
            AttnRows rows = attn_rows;
            if (rows.q_width == 0) rows.q_width = rows.kv_width = p.size(0) / 3;
            QK_CHECK(p.size(0) == rows.q_width + 2 * rows.kv_width,
                     "Muon: '{}' must have {} + 2 · {} rows (q, k, v), got shape {}", name,
                     rows.q_width, rows.kv_width, p.shape());
            const int64_t widths[3] = {rows.q_width, rows.kv_width, rows.kv_width};
            for (int64_t part = 0, begin = 0; part < 3; begin += widths[part++])
                split.muon.push_back({p, begin, widths[part], name + "." + "qkv"[part]});
        } else {
            split.muon.push_back({p, 0, -1, name});
        }
    }
    return split;
}

RunOptimizer::RunOptimizer(const std::vector<std::pair<std::string, Tensor>>& named_params,
                           const RunOptimizerOptions& options)
    : adamw_options_(options.adamw) {
    QK_CHECK(options.zero == 0 || options.zero == 1, "train: --zero must be 0 or 1, got {}",
             options.zero);
    QK_CHECK(!(options.muon && options.zero == 1),
             "train: --optimizer muon does not combine with --zero 1 (ZeRO-1 shards AdamW's "
             "moments; Muon orthogonalises whole matrices on every rank): use --zero 0");
    for (const auto& [name, p] : named_params) params_.push_back(p);
    ParameterSplit split;
    if (options.muon)
        split = split_for_muon(named_params, options.attn_rows);
    else
        split.adamw = named_params;
    for (const auto& [name, p] : split.adamw) {
        adamw_names_.push_back(name);
        adamw_params_.push_back(p);
    }
    if (options.muon) muon_ = std::make_unique<Muon>(split.muon, options.muon_options);
    if (options.zero == 1) {
        sharded_ = std::make_unique<ShardedAdamW>(adamw_params_, adamw_options_);
        return;
    }
    adamw_ = std::make_unique<AdamW>(adamw_params_, adamw_options_);
    if (dist::world_size() > 1)
        sync_ = std::make_unique<GradientSync>(params_, options.bucket_bytes, options.overlap);
}

void RunOptimizer::set_sync(bool on) {
    if (sync_) sync_->set_enabled(on);
}

void RunOptimizer::finish_gradients() {
    if (sync_) sync_->finish();
    if (sharded_) sharded_->reduce_gradients();
}

double RunOptimizer::clip(double max_norm, double loss_scale) {
    if (sharded_) return sharded_->clip_grad_norm(max_norm, loss_scale);
    return clip_grad_norm(params_, max_norm, /*throw_on_nonfinite=*/false, loss_scale);
}

void RunOptimizer::step(double lr) {
    if (sharded_)
        sharded_->step(lr);
    else
        adamw_->step(lr);
    if (muon_) muon_->step(lr);
}

void RunOptimizer::zero_grad() {
    if (sharded_)
        sharded_->zero_grad();
    else
        adamw_->zero_grad();
    if (muon_) muon_->zero_grad();
}

bool RunOptimizer::all_finite() const {
    bool mine = finite(params_) && finite(sharded_ ? sharded_->state() : adamw_->state());
    if (muon_) mine = mine && finite(muon_->state());
    return dist::all_reduce_max(mine ? 0.0 : 1.0) == 0.0;  // a shard's NaN stops every rank
}

OptimizerState RunOptimizer::state() const {
    OptimizerState out;
    if (sharded_) {
        const AdamW whole = sharded_->gather_full();
        append_adamw_state(out, adamw_names_, whole.state());
        out.steps = whole.steps();
    } else {
        append_adamw_state(out, adamw_names_, adamw_->state());
        out.steps = adamw_->steps();
    }
    if (muon_) {
        const std::vector<Tensor> momentum = muon_->state();
        for (size_t i = 0; i < momentum.size(); ++i)
            out.tensors.emplace_back("muon_momentum." + muon_->matrices()[i].name, momentum[i]);
    }
    return out;
}

void RunOptimizer::load(const OptimizerState& state) {
    const size_t adamw_count = 2 * adamw_names_.size();
    const size_t muon_count = muon_ ? muon_->matrices().size() : 0;
    QK_CHECK(state.tensors.size() == adamw_count + muon_count,
             "train: the optimizer state has {} tensors, this run's optimizer expects {}",
             state.tensors.size(), adamw_count + muon_count);
    std::vector<Tensor> moments, momentum;
    for (size_t i = 0; i < state.tensors.size(); ++i)
        (i < adamw_count ? moments : momentum).push_back(state.tensors[i].second);
    if (sharded_) {
        AdamW whole(adamw_params_, adamw_options_);
        whole.load_state(moments, state.steps);
        sharded_->load_full(whole);
    } else {
        adamw_->load_state(moments, state.steps);
    }
    if (muon_) muon_->load_state(momentum, state.steps);
}

int64_t RunOptimizer::state_bytes() const {
    int64_t bytes = 0;
    if (sharded_) {
        bytes = sharded_->moment_bytes();
    } else {
        for (const Tensor& p : adamw_params_)
            bytes += 2 * p.numel() * static_cast<int64_t>(dtype_size(p.dtype()));
    }
    if (muon_)
        for (const Tensor& m : muon_->state())
            bytes += m.numel() * static_cast<int64_t>(dtype_size(m.dtype()));
    return bytes;
}

}  // namespace qk::nn
