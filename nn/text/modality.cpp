// Synthetic images and the mixed text + image stream (nn/text/modality.h, docs/modalities.md).
#include "nn/text/modality.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace qk::nn {

namespace {

constexpr int64_t kMaxCodes = 4096;
constexpr int64_t kMaxImageSize = 64;
constexpr int64_t kBisectionImages = 256;
constexpr int64_t kProbeBudget = int64_t{1} << 25;
constexpr uint64_t kBisectionSeed = 0x1a9e5;
constexpr double kMinTemperature = 0.05, kMaxTemperature = 1e4;

// The cell's distribution p(x | μ) ∝ exp(−(x − μ)² / (2τ²)) over the K codes, into p; returns
// its entropy in bits. No neighbour (μ NaN): uniform.
double cell_distribution(double mu, double temperature, std::vector<double>& p) {
    const auto K = static_cast<int64_t>(p.size());
    if (std::isnan(mu)) {
        std::fill(p.begin(), p.end(), 1.0 / static_cast<double>(K));
        return std::log2(static_cast<double>(K));
    }
    // Exponents relative to the largest weight (the code nearest μ), so that a small τ cannot
    // underflow every weight to 0.
    const double nearest = std::clamp(std::round(mu), 0.0, static_cast<double>(K - 1));
    const double inv = 1.0 / (2.0 * temperature * temperature), dn = nearest - mu;
    // Past |x - μ| = reach the exponent is below -746, where exp is exactly 0: those codes are
    // set to 0 without calling it (the same p, and a small τ costs O(τ), not O(K)).
    const double reach = std::sqrt(746.0 / inv + dn * dn);
    const auto first = static_cast<int64_t>(std::max(0.0, std::floor(mu - reach)));
    const auto last =
        static_cast<int64_t>(std::min(static_cast<double>(K - 1), std::ceil(mu + reach)));
    std::fill(p.begin(), p.end(), 0.0);
    double total = 0;
    for (int64_t x = first; x <= last; ++x) {
        const double dx = static_cast<double>(x) - mu;
        p[static_cast<size_t>(x)] = std::exp(-(dx * dx - dn * dn) * inv);
        total += p[static_cast<size_t>(x)];
    }
    double bits = 0;
    for (double& v : p) {
        v /= total;
        if (v > 0) bits -= v * std::log2(v);
    }
    return bits;
}

// The mean of the cell's left and upper neighbours (those that exist), NaN for the first cell.
double context_mean(const int32_t* image, int64_t row, int64_t col, int64_t N) {
    const bool left = col > 0, up = row > 0;
    if (left && up) return 0.5 * (image[row * N + col - 1] + image[(row - 1) * N + col]);
    if (left) return image[row * N + col - 1];
    if (up) return image[(row - 1) * N + col];
    return NAN;
}

// Inverse-CDF draw from p with one uniform.
int32_t draw_code(const std::vector<double>& p, double u) {
    double cumulative = 0;
    for (size_t x = 0; x + 1 < p.size(); ++x) {
        cumulative += p[x];
        if (u < cumulative) return static_cast<int32_t>(x);
    }
    return static_cast<int32_t>(p.size() - 1);
}

// Segment lengths: geometric on {1, 2, ...} with the given mean (mean 1: always 1).
int64_t geometric(Generator& gen, double mean) {
    if (mean <= 1) return 1;
    const double u = gen.uniform();
    return 1 + static_cast<int64_t>(std::floor(std::log1p(-u) / std::log1p(-1.0 / mean)));
}

}  // namespace

void ImageSource::validate() const {
    QK_CHECK(codes >= 2 && codes <= kMaxCodes, "images: codes must be in [2, {}], got {}",
             kMaxCodes, codes);
    QK_CHECK(size >= 1 && size <= kMaxImageSize, "images: size must be in [1, {}], got {}",
             kMaxImageSize, size);
    QK_CHECK(std::isfinite(temperature) && temperature > 0,
             "images: temperature must be finite and > 0, got {}", temperature);
}

double draw_image(const ImageSource& source, Generator& gen, int32_t* out) {
    const int64_t N = source.size;
    std::vector<double> p(static_cast<size_t>(source.codes));
    double bits = 0;
    for (int64_t row = 0; row < N; ++row)
        for (int64_t col = 0; col < N; ++col) {
            bits += cell_distribution(context_mean(out, row, col, N), source.temperature, p);
            out[row * N + col] = draw_code(p, gen.uniform());
        }
    return bits;
}

double image_entropy_bits(const ImageSource& source, int64_t images, uint64_t seed) {
    source.validate();
    QK_CHECK(images >= 1, "images: the entropy needs at least one image, got {}", images);
    Generator gen(seed);
    std::vector<int32_t> image(static_cast<size_t>(source.size * source.size));
    double bits = 0;
    for (int64_t i = 0; i < images; ++i) bits += draw_image(source, gen, image.data());
    return bits / static_cast<double>(images * source.size * source.size);
}

int64_t probe_images(int64_t codes, int64_t size) {
    return std::clamp(kProbeBudget / (size * size * codes), int64_t{1}, kBisectionImages);
}

double temperature_for_entropy(double bits, int64_t codes, int64_t size) {
    const int64_t images = probe_images(codes, size);
    auto entropy = [&](double temperature) {
        return image_entropy_bits({codes, size, temperature}, images, kBisectionSeed);
    };
    const double lowest = entropy(kMinTemperature), highest = entropy(kMaxTemperature);
    QK_CHECK(std::isfinite(bits) && bits >= lowest && bits <= highest,
             "images: an entropy of {} bits per code is out of reach with {} codes of {}x{} "
             "images; the source gives {:.3f} to {:.3f}",
             bits, codes, size, size, lowest, highest);
    // Bisection on log τ: the entropy grows with τ (flatter cells).
    double lo = std::log(kMinTemperature), hi = std::log(kMaxTemperature);
    for (int i = 0; i < 60 && hi - lo > 1e-9; ++i) {
        const double mid = 0.5 * (lo + hi);
        (entropy(std::exp(mid)) < bits ? lo : hi) = mid;
    }
    return std::exp(0.5 * (lo + hi));
}

namespace {

void check_image_fraction(double fraction) {
    QK_CHECK(std::isfinite(fraction) && fraction >= 0 && fraction <= 0.9,
             "--image-fraction must be in [0, 0.9], got {}", fraction);
}

}  // namespace

void ModalityMix::validate() const {
    check_image_fraction(image_fraction);
    QK_CHECK(image_codes >= 2 && image_codes <= kMaxCodes,
             "--image-codes must be in [2, {}], got {}", kMaxCodes, image_codes);
    QK_CHECK(image_size >= 1 && image_size <= kMaxImageSize,
             "--image-size must be in [1, {}], got {}", kMaxImageSize, image_size);
    QK_CHECK(std::isfinite(image_entropy) && image_entropy > 0,
             "--image-entropy must be a number of bits per code > 0, got {}", image_entropy);
}

ImageSource ModalityMix::image_source() const {
    validate();
    return {image_codes, image_size,
            temperature_for_entropy(image_entropy, image_codes, image_size)};
}

double MixedStream::Summary::image_token_share() const {
    return tokens == 0 ? 0.0
                       : static_cast<double>(tokens - text_tokens) / static_cast<double>(tokens);
}

double MixedStream::Summary::bits_per_code(int64_t image_size) const {
    return images == 0 ? 0.0 : image_bits / static_cast<double>(images * image_size * image_size);
}

MixedStream mix_modalities(const std::vector<int32_t>& text, const ModalityVocab& vocab,
                           double image_fraction, const ImageSource& images, uint64_t seed) {
    check_image_fraction(image_fraction);
    images.validate();
    MixedStream stream;
    MixedStream::Summary& summary = stream.summary;
    summary.text_tokens = summary.tokens = static_cast<int64_t>(text.size());
    if (image_fraction == 0) {
        stream.tokens = text;
        return stream;
    }
    summary.temperature = images.temperature;
    // A span of S tokens after text segments of mean L makes the image share S / (S + L).
    const auto cells = static_cast<size_t>(images.size * images.size);
    const auto span = static_cast<double>(cells + 2);  // [BOI], the codes, [EOI]
    const double mean_segment = span * (1 - image_fraction) / image_fraction;
    Generator gen(seed);
    std::vector<int32_t> image(cells);
    stream.tokens.reserve(static_cast<size_t>(static_cast<double>(text.size()) *
                                              (1 + span / std::max(mean_segment, 1.0))) +
                          cells + 2);
    size_t next = 0;
    while (next < text.size()) {
        const auto length =
            std::min(static_cast<size_t>(geometric(gen, mean_segment)), text.size() - next);
        stream.tokens.insert(stream.tokens.end(), text.begin() + static_cast<ptrdiff_t>(next),
                             text.begin() + static_cast<ptrdiff_t>(next + length));
        next += length;
        if (next == text.size()) break;
        summary.image_bits += draw_image(images, gen, image.data());
        stream.tokens.push_back(vocab.boi());
        for (int32_t code : image)
            stream.tokens.push_back(static_cast<int32_t>(vocab.first_code() + code));
        stream.tokens.push_back(vocab.eoi());
        ++summary.images;
    }
    summary.tokens = static_cast<int64_t>(stream.tokens.size());
    return stream;
}

std::string describe_mix(const ModalityMix& mix, const MixedStream::Summary& summary) {
    return fmt::format(
        "images: {:.1f} % of the training tokens, {} images of {}x{} codes (K = {}), {:.3f} "
        "bits per code (tau {:.3g})",
        100 * summary.image_token_share(), summary.images, mix.image_size, mix.image_size,
        mix.image_codes, summary.bits_per_code(mix.image_size), summary.temperature);
}

// ---- the tokenizer -----------------------------------------------------------------------------

namespace {

constexpr const char* kBoi = "[BOI]";
constexpr const char* kEoi = "[EOI]";
constexpr std::string_view kRamp = " .:-=+*#%@";

class MixedTokenizer final : public TokenizerModel {
  public:
    MixedTokenizer(Tokenizer text, int64_t codes)
        : text_(std::move(text)), vocab_{text_.vocab_size(), codes} {}

    std::vector<int32_t> encode(std::string_view text, bool parse_special) const override {
        if (!parse_special) return text_.encode(text, false);
        std::vector<int32_t> ids;
        while (!text.empty()) {
            const size_t boi = text.find(kBoi), eoi = text.find(kEoi);
            const size_t marker = std::min(boi, eoi);
            const auto piece = text_.encode(text.substr(0, marker), true);
            ids.insert(ids.end(), piece.begin(), piece.end());
            if (marker == std::string_view::npos) break;
            ids.push_back(marker == boi ? vocab_.boi() : vocab_.eoi());
            text.remove_prefix(marker + 5);
        }
        return ids;
    }
    std::string decode(const std::vector<int32_t>& ids) const override {
        std::string out;
        std::vector<int32_t> run;  // text ids waiting to be decoded together (BPE merges bytes)
        auto flush = [&] {
            out += text_.decode(run);
            run.clear();
        };
        for (int32_t id : ids) {
            QK_CHECK(id >= 0 && id < vocab_.size(),
                     "Tokenizer: id {} is outside the vocabulary [0, {})", id, vocab_.size());
            if (id < vocab_.text_vocab) {
                run.push_back(id);
                continue;
            }
            flush();
            if (id == vocab_.boi())
                out += kBoi;
            else if (id == vocab_.eoi())
                out += kEoi;
            else
                out +=
                    kRamp[static_cast<size_t>((id - vocab_.first_code()) *
                                              static_cast<int64_t>(kRamp.size()) / vocab_.codes)];
        }
        flush();
        return out;
    }
    int64_t vocab_size() const override { return vocab_.size(); }
    std::string kind() const override { return "mixed"; }
    std::optional<int32_t> token_id(std::string_view piece) const override {
        if (piece == kBoi) return vocab_.boi();
        if (piece == kEoi) return vocab_.eoi();
        return text_.model().token_id(piece);
    }
    std::optional<int32_t> document_separator() const override {
        return text_.document_separator();
    }

    const Tokenizer& text() const { return text_; }
    const ModalityVocab& vocab() const { return vocab_; }

  private:
    Tokenizer text_;
    ModalityVocab vocab_;
};

}  // namespace

Tokenizer mixed_tokenizer(const Tokenizer& text, int64_t codes) {
    QK_CHECK(text.kind() != "mixed", "mixed_tokenizer: the text tokenizer is already mixed");
    QK_CHECK(codes >= 2 && codes <= kMaxCodes, "mixed_tokenizer: codes must be in [2, {}], got {}",
             kMaxCodes, codes);
    return Tokenizer(std::make_shared<MixedTokenizer>(text, codes));
}

ModalityVocab modality_vocab(const Tokenizer& t) {
    const auto* mixed = dynamic_cast<const MixedTokenizer*>(&t.model());
    return mixed ? mixed->vocab() : ModalityVocab{};
}

std::string serialize_mixed(const Tokenizer& t) {
    const auto& mixed = dynamic_cast<const MixedTokenizer&>(t.model());
    return fmt::format("mixed:{}:{}", mixed.vocab().codes, mixed.text().serialize());
}

Tokenizer deserialize_mixed(const std::string& s) {
    const size_t colon = s.find(':', 6);
    int64_t codes = 0;
    bool number = colon != std::string::npos && colon > 6 && colon - 6 <= 4;
    for (size_t i = 6; number && i < colon; ++i) {
        number = std::isdigit(static_cast<unsigned char>(s[i])) != 0;
        codes = codes * 10 + (s[i] - '0');
    }
    QK_CHECK(number, "Tokenizer: cannot read '{}' (expected 'mixed:' + codes + ':' + a tokenizer)",
             s.substr(0, 40));
    return mixed_tokenizer(Tokenizer::deserialize(s.substr(colon + 1)), codes);
}

}  // namespace qk::nn
