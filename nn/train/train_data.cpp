#include "nn/train/train_data.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "core/distributed.h"
#include "core/error.h"

namespace qk::nn {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kBytesProbeTokens = int64_t{4} << 20;
constexpr uint64_t kImageSeed = 0x1ae9e;

std::string fnv1a(std::string_view bytes) {
    uint64_t h = 0xcbf29ce484222325u;
    for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3u;
    return fmt::format("{:016x}", h);
}

// The image source, its temperature fitted to --image-entropy: up to ~10 s for the largest
// images (64x64 of 4096 codes), so the wait is announced and timed.
ImageSource image_source_with_progress(const TrainConfig& cfg) {
    const ModalityMix& mix = cfg.modalities;
    const bool show = cfg.progress && dist::is_root();
    if (show)
        fmt::print(stderr,
                   "images: fitting the temperature for {} bits per code ({}x{}, K = {})...",
                   mix.image_entropy, mix.image_size, mix.image_size, mix.image_codes);
    const auto t0 = std::chrono::steady_clock::now();
    const ImageSource source = mix.image_source();
    if (show)
        fmt::print(stderr, " {:.1f} s\n",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return source;
}

TrainingData from_text_file(const TrainConfig& cfg) {
    TrainingData d;
    const std::string text = read_text_file(cfg.data_path, "train: --data");
    d.tokenizer = Tokenizer::from_flag(cfg.tokenizer, text);
    // Split the text, then encode each side: the validation text is then the same bytes for
    // every tokenizer, which is what makes their bits per byte comparable. For chars and bytes
    // (one token per byte) it is also the split of the tokens.
    const auto split = static_cast<size_t>(static_cast<double>(text.size()) * 0.9);
    const std::string_view all(text);
    std::vector<int32_t> train = d.tokenizer.encode(all.substr(0, split), false);
    std::vector<int32_t> val = d.tokenizer.encode(all.substr(split), false);
    if (cfg.multimodal()) {
        // Images are data, not training randomness: the same images for every run seed.
        d.modalities = {d.tokenizer.vocab_size(), cfg.modalities.image_codes};
        d.tokenizer = mixed_tokenizer(d.tokenizer, cfg.modalities.image_codes);
        const double fraction = cfg.modalities.image_fraction;
        const ImageSource images = fraction > 0 ? image_source_with_progress(cfg) : ImageSource{};
        MixedStream train_mix = mix_modalities(train, d.modalities, fraction, images, kImageSeed);
        train = std::move(train_mix.tokens);
        d.train_mix = train_mix.summary;
        val = mix_modalities(val, d.modalities, fraction, images, kImageSeed + 1).tokens;
    }
    // Mixed with images: bits of the whole stream per byte of its text.
    d.val_bytes_per_token = static_cast<double>(text.size() - split) /
                            static_cast<double>(std::max<size_t>(val.size(), 1));
    d.dataset = std::make_unique<TextDataset>(
        tokens_in_memory(std::move(train)), tokens_in_memory(std::move(val)), cfg.context_length());
    d.fingerprint = fmt::format("{} bytes, fnv1a64 {}", text.size(), fnv1a(text));
    return d;
}

TrainingData from_token_files(const TrainConfig& cfg) {
    QK_CHECK(cfg.tokenizer != "char",
             "train: --data {} is a directory of token files: --tokenizer must name the "
             "tokenizer that made them (a tokenizer.json, a tokenizer.model or a directory "
             "holding one), not 'char'",
             cfg.data_path);
    TrainingData d;
    d.tokenizer = Tokenizer::from_flag(cfg.tokenizer, "");
    const TokenFiles files = find_token_files(cfg.data_path);
    const int64_t vocab = d.tokenizer.vocab_size();
    auto train = map_token_files(files.train, vocab), val = map_token_files(files.val, vocab);
    const int64_t probe = std::min(val->size(), kBytesProbeTokens);
    std::vector<int32_t> ids(static_cast<size_t>(probe));
    val->read(0, probe, ids.data());
    d.val_bytes_per_token =
        static_cast<double>(d.tokenizer.decode(ids).size()) / static_cast<double>(probe);
    // The counts, and a hash of the validation tokens probed above (not every token of a
    // corpus that can be gigabytes).
    d.fingerprint = fmt::format(
        "{} train and {} val tokens, fnv1a64 {}", train->size(), val->size(),
        fnv1a({reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t)}));
    d.dataset =
        std::make_unique<TextDataset>(std::move(train), std::move(val), cfg.context_length());
    return d;
}

}  // namespace

double TrainingData::bits_per_byte(double nats_per_token) const {
    return nats_per_token / std::log(2.0) / val_bytes_per_token;
}

TrainingData load_training_data(const TrainConfig& cfg) {
    return fs::is_directory(cfg.data_path) ? from_token_files(cfg) : from_text_file(cfg);
}

}  // namespace qk::nn
