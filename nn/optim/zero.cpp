#include "nn/optim/zero.h"

#include <cmath>

#include "autograd/grad_mode.h"
#include "core/distributed.h"
#include "core/error.h"
#include "core/factory.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

namespace qk::nn {

namespace {

int64_t total_elements(const std::vector<Tensor>& params) {
    int64_t total = 0;
    for (const Tensor& p : params) total += p.numel();
    return total;
}

int64_t shard_size_of(const std::vector<Tensor>& params) {
    const int64_t ranks = dist::world_size();
    return (total_elements(params) + ranks - 1) / ranks;
}

// Calls f(k, start) for every parameter k, start its first element in the end-to-end vector.
template <class F>
void for_each_start(const std::vector<Tensor>& params, F f) {
    int64_t start = 0;
    for (size_t k = 0; k < params.size(); ++k) {
        f(k, start);
        start += params[k].numel();
    }
}

// Parameter k's elements as one flat contiguous tensor (a view: parameters are contiguous).
Tensor flat(const Tensor& p) { return p.detach().reshape({p.numel()}); }

}  // namespace

void copy_gradient_into(const Tensor& place, const Tensor& param) {
    const Tensor grad = param.grad();
    if (grad.defined())
        copy_into(place, grad.to(place.device()).reshape({param.numel()}));
    else  // no gradient reached it in this pass: 0
        copy_into(place, zeros({param.numel()}, param.dtype(), place.device()));
}

ShardedAdamW::ShardedAdamW(std::vector<Tensor> params, AdamWOptions options)
    : params_(std::move(params)),
      shard_size_(shard_size_of(params_)),
      pieces_([&] {
          std::vector<Piece> pieces;
          const int64_t first = dist::rank() * shard_size_, last = first + shard_size_;
          for_each_start(params_, [&](size_t k, int64_t start) {
              const int64_t lo = std::max(first, start);
              const int64_t hi = std::min(last, start + params_[k].numel());
              if (lo < hi) pieces.push_back({k, lo - start, hi - lo});
          });
          return pieces;
      }()),
      views_(shard_views(params_, pieces_)),
      shard_opt_(views_, options, [&] {
          std::vector<bool> decayed;  // AdamW's rule, of the whole parameter: rank >= 2
          for (const Piece& piece : pieces_) decayed.push_back(params_[piece.param].dim() >= 2);
          return decayed;
      }()) {
    QK_CHECK(!params_.empty(), "ShardedAdamW: no parameters");
    const DType dtype = params_.front().dtype();
    const int64_t ranks = dist::world_size();
    grad_flat_ = zeros({ranks * shard_size_}, dtype);  // the padding past the parameters stays 0
    grad_shard_ = zeros({shard_size_}, dtype);
    param_flat_ = zeros({ranks * shard_size_}, dtype);
    param_shard_ = zeros({shard_size_}, dtype);
}

std::vector<Tensor> ShardedAdamW::shard_views(const std::vector<Tensor>& params,
                                              const std::vector<Piece>& pieces) {
    std::vector<Tensor> views;
    for (const Piece& piece : pieces) {
        const Tensor& p = params[piece.param];
        QK_CHECK(p.is_contiguous() && p.dtype() == params.front().dtype(),
                 "ShardedAdamW: parameters must be contiguous and of one dtype, got {} {}",
                 p.dtype(), p.shape());
        Tensor view = flat(p).narrow(0, piece.begin, piece.length);
        view.requires_grad_();  // a leaf of its own that shares the parameter's memory
        views.push_back(view);
    }
    return views;
}

void ShardedAdamW::reduce_gradients() {
    NoGradGuard no_grad;
    for_each_start(params_, [&](size_t k, int64_t start) {
        const Tensor& p = params_[k];
        copy_gradient_into(grad_flat_.narrow(0, start, p.numel()), p);
    });
    dist::reduce_scatter_sum(grad_flat_, grad_shard_);
    copy_into(grad_shard_, grad_shard_ * (1.0 / static_cast<double>(dist::world_size())));
}

double ShardedAdamW::clip_grad_norm(double max_norm, double loss_scale) {
    NoGradGuard no_grad;
    const Tensor g64 = grad_shard_.to(kF64);
    const double norm = std::sqrt(dist::all_reduce_sum(sum(g64 * g64).item())) / loss_scale;
    if (!std::isfinite(norm)) return norm;
    if (const double scale = clip_multiplier(norm, max_norm, loss_scale); scale != 1.0)
        copy_into(grad_shard_, grad_shard_ * scale);
    return norm;
}

void ShardedAdamW::step(double lr) {
    NoGradGuard no_grad;
    int64_t offset = 0;  // each piece's gradient: its part of the shard, where the piece lives
    for (size_t i = 0; i < pieces_.size(); ++i) {
        views_[i].set_grad(
            grad_shard_.narrow(0, offset, pieces_[i].length).to(views_[i].device()).contiguous());
        offset += pieces_[i].length;
    }
    shard_opt_.step(lr);  // updates the parameters' own elements, through the views
    offset = 0;
    for (size_t i = 0; i < pieces_.size(); ++i) {
        copy_into(param_shard_.narrow(0, offset, pieces_[i].length), views_[i].to(Device::cpu));
        offset += pieces_[i].length;
    }
    dist::all_gather_into(param_shard_, param_flat_);
    for_each_start(params_, [&](size_t k, int64_t start) {
        const Tensor& p = params_[k];
        copy_into(flat(p), param_flat_.narrow(0, start, p.numel()).to(p.device()));
    });
}

void ShardedAdamW::zero_grad() {
    for (Tensor& p : params_) p.zero_grad();
    shard_opt_.zero_grad();
}

int64_t ShardedAdamW::moment_bytes() const {
    return 2 * shard_size_ * static_cast<int64_t>(dtype_size(params_.front().dtype()));
}

AdamW ShardedAdamW::gather_full() const {
    NoGradGuard no_grad;
    const std::vector<Tensor> shard_state = shard_opt_.state();  // m, v per piece
    std::vector<Tensor> moments;                                 // m, v: (N·S) each, gathered
    for (int which = 0; which < 2; ++which) {
        Tensor shard = zeros({shard_size_}, params_.front().dtype());
        int64_t offset = 0;
        for (size_t i = 0; i < pieces_.size(); ++i) {
            copy_into(shard.narrow(0, offset, pieces_[i].length),
                      shard_state[2 * i + which].to(Device::cpu));
            offset += pieces_[i].length;
        }
        Tensor gathered = zeros({dist::world_size() * shard_size_}, shard.dtype());
        dist::all_gather_into(shard, gathered);
        moments.push_back(gathered);
    }
    std::vector<Tensor> state;  // AdamW's order: m then v, per parameter
    for_each_start(params_, [&](size_t k, int64_t start) {
        for (const Tensor& moment : moments)
            state.push_back(moment.narrow(0, start, params_[k].numel())
                                .reshape(params_[k].shape())
                                .to(params_[k].device()));
    });
    AdamW full(params_, shard_opt_.options());
    full.load_state(state, shard_opt_.steps());
    return full;
}

void ShardedAdamW::load_full(const AdamW& full) {
    NoGradGuard no_grad;
    const std::vector<Tensor> whole = full.state();
    QK_CHECK(whole.size() == 2 * params_.size(),
             "ShardedAdamW: a state of {} tensors for {} parameters", whole.size(), params_.size());
    std::vector<Tensor> mine;
    for (const Piece& piece : pieces_)
        for (int which = 0; which < 2; ++which)
            mine.push_back(
                flat(whole[2 * piece.param + which]).narrow(0, piece.begin, piece.length));
    shard_opt_.load_state(mine, full.steps());
}

}  // namespace qk::nn
