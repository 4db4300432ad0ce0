#include "nn/optim/data_parallel.h"

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/factory.h"
#include "nn/optim/zero.h"
#include "ops/elementwise.h"

namespace qk::nn {

GradientSync::GradientSync(std::vector<Tensor> params, int64_t bucket_bytes, bool overlap)
    : params_(std::move(params)), overlap_(overlap) {
    QK_CHECK(bucket_bytes > 0, "GradientSync: the bucket size must be > 0 bytes, got {}",
             bucket_bytes);
    for (const Tensor& p : params_)
        QK_CHECK(p.is_leaf() && p.requires_grad() && p.dtype() == params_.front().dtype(),
                 "GradientSync: every parameter must be a leaf that requires grad, of one dtype");
    // Reverse order: backward completes the last layer's gradients first.
    int64_t filled = bucket_bytes;
    for (size_t i = params_.size(); i-- > 0;) {
        const int64_t bytes =
            params_[i].numel() * static_cast<int64_t>(dtype_size(params_[i].dtype()));
        if (filled + bytes > bucket_bytes && filled > 0) {
            buckets_.emplace_back();
            filled = 0;
        }
        buckets_.back().members.push_back(i);
        filled += bytes;
        bytes_ += bytes;
    }
    for (size_t b = 0; b < buckets_.size(); ++b) {
        int64_t numel = 0;
        for (size_t i : buckets_[b].members) {
            numel += params_[i].numel();
            params_[i].on_grad_ready([this, b] { on_ready(b); });
        }
        buckets_[b].flat = Tensor::empty({numel}, params_.front().dtype(), bucket_device());
    }
}

// Device gradients are summed on the device when NCCL is there, else through host buffers.
Device GradientSync::bucket_device() const {
    const Device device = params_.front().device();
    return device == Device::cuda && dist::device_sums_in_place() ? Device::cuda : Device::cpu;
}

GradientSync::~GradientSync() {
    for (Bucket& bucket : buckets_) bucket.sum.wait();
    for (Tensor& p : params_) p.clear_grad_ready_hooks();
}

void GradientSync::on_ready(size_t b) {
    if (!enabled_) return;
    ++buckets_[b].ready;
    // Buckets start in index order, each once complete: MPI matches collectives by the order
    // each rank calls them, and the order in which gradients complete need not be the same on
    // every rank.
    auto complete = [&](const Bucket& bucket) {
        return bucket.ready == static_cast<int64_t>(bucket.members.size());
    };
    while (overlap_ && next_ < buckets_.size() && complete(buckets_[next_]))
        start(buckets_[next_++]);
    // Open MPI moves a non-blocking collective on only inside MPI calls: give the buckets in
    // flight a turn at every hook.
    for (Bucket& other : buckets_)
        if (other.started) other.sum.test();
}

void GradientSync::start(Bucket& bucket) {
    int64_t offset = 0;
    for (size_t i : bucket.members) {
        copy_gradient_into(bucket.flat.narrow(0, offset, params_[i].numel()), params_[i]);
        offset += params_[i].numel();
    }
    if (bucket.flat.device() == Device::cpu)
        bucket.sum = dist::all_reduce_sum_async(bucket.flat);
    else
        dist::all_reduce_sum(bucket.flat);  // NCCL on its own stream; done when it returns
    bucket.started = true;
}

void GradientSync::finish() {
    NoGradGuard no_grad;
    const auto t0 = std::chrono::steady_clock::now();
    for (; next_ < buckets_.size(); ++next_) start(buckets_[next_]);
    next_ = 0;
    const double inverse_ranks = 1.0 / dist::world_size();
    for (Bucket& bucket : buckets_) {
        bucket.sum.wait();
        int64_t offset = 0;
        for (size_t i : bucket.members) {
            Tensor& p = params_[i];
            Tensor mean = (bucket.flat.narrow(0, offset, p.numel()) * inverse_ranks)
                              .reshape(p.shape())
                              .to(p.device());
            p.set_grad(mean);
            offset += p.numel();
        }
        bucket.ready = 0;
        bucket.started = false;
    }
    last_wait_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

namespace {

// FNV-1a over the parameters' bytes (float32 or float64 as stored, in parameter order).
std::string parameter_hash(const std::vector<Tensor>& params) {
    uint64_t hash = 1469598103934665603ull;
    for (const Tensor& p : params) {
        const Tensor c = p.to(Device::cpu).contiguous();
        const auto* bytes = static_cast<const unsigned char*>(c.raw_data());
        const size_t n = static_cast<size_t>(c.numel()) * dtype_size(c.dtype());
        for (size_t i = 0; i < n; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
    }
    return fmt::format("{:016x}", hash);
}

// The first field (dotted path into nested objects) where a and b differ, with both values.
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b,
                             const std::string& path = "") {
    if (a.is_object() && b.is_object()) {
        for (const auto& [key, value] : a.items()) {
            const std::string field = path.empty() ? key : path + "." + key;
            if (!b.contains(key)) return fmt::format("{} is missing", field);
            if (std::string d = first_difference(value, b[key], field); !d.empty()) return d;
        }
        for (const auto& [key, value] : b.items())
            if (!a.contains(key))
                return fmt::format("{} is extra", path.empty() ? key : path + "." + key);
        return "";
    }
    return a == b ? "" : fmt::format("{}: {} vs {}", path, a.dump(), b.dump());
}

}  // namespace

void check_replicas_agree(const std::string& settings, const std::vector<Tensor>& params) {
    if (dist::world_size() == 1) return;  // nothing to compare (and no hash to compute)
    const std::vector<std::string> all = dist::all_gather(settings);
    const std::vector<std::string> hashes = dist::all_gather(parameter_hash(params));
    for (size_t r = 1; r < all.size(); ++r) {
        if (all[r] != all[0]) {
            const auto a = nlohmann::json::parse(all[0], nullptr, false);
            const auto b = nlohmann::json::parse(all[r], nullptr, false);
            throw Error(fmt::format(
                "data-parallel: rank {} was started with other settings than rank 0 ({}, rank 0 "
                "vs rank {}); every rank must run the same command",
                r, first_difference(a, b), r));
        }
        QK_CHECK(hashes[r] == hashes[0],
                 "data-parallel: rank {} starts from other weights than rank 0 (parameter hash {} "
                 "vs {}); every rank must build the same model from the same seed",
                 r, hashes[r], hashes[0]);
    }
}

void broadcast_tensors(const std::vector<Tensor>& tensors, int root) {
    for (const Tensor& t : tensors) dist::broadcast(t, root);
}

std::string broadcast_string(const std::string& value, int root) {
    if (dist::world_size() == 1) return value;
    return dist::all_gather(value)[static_cast<size_t>(root)];
}

}  // namespace qk::nn
