// A second modality for the stability lab (docs/modalities.md): synthetic "images", spans of
// codes from their own sub-vocabulary between [BOI] and [EOI] markers, interleaved with text.
//
// An image is an N × N grid of codes 0 … K−1, drawn in raster order from a 2-D Markov field:
// the code x at a cell whose left and upper neighbours hold l and u is drawn from
//     p(x | μ) ∝ exp(−(x − μ)² / (2τ²)),   μ = (l + u) / 2   (one neighbour: μ = it),
// over the K codes (the first cell: uniform). Small τ gives smooth, near-constant images; large τ
// gives near-uniform noise. Every probability is known, so the entropy of the source is exact up
// to sampling: the mean over cells of H(p(· | μ)), in bits per code (what a perfect model of the
// images would reach). The knob is that entropy: temperature_for_entropy finds the τ that gives
// it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/text/tokenizer.h"

namespace qk::nn {

struct ImageSource {
    int64_t codes = 64;      // K: the image sub-vocabulary
    int64_t size = 6;        // N: an image is N × N codes
    double temperature = 1;  // τ

    void validate() const;
};

// Draws one image (N·N codes, row-major) into `out` and returns the entropy of the cells'
// distributions, summed over the cells, in bits (the information the image was drawn with, in
// expectation).
double draw_image(const ImageSource& source, Generator& gen, int32_t* out);

// The source's entropy in bits per code, estimated over `images` images drawn from `seed`: the
// mean over cells of H(p(· | μ)) (exact per cell; only the contexts μ are sampled).
double image_entropy_bits(const ImageSource& source, int64_t images, uint64_t seed);

// The τ whose image_entropy_bits (over a fixed sample of probe_images images) is `bits`, by
// bisection; a qk::Error naming the reachable range when `bits` is outside it (near
// log2(K)/N² … log2 K).
double temperature_for_entropy(double bits, int64_t codes, int64_t size);
// The images each bisection probe draws: 256, fewer where that would cost more than 2^25 code
// evaluations (N² · K per image; 64x64 images of 4096 codes took minutes before step 1), and at
// least one. About 36 probes make a fit: at most ~10 s here.
int64_t probe_images(int64_t codes, int64_t size);

// A text stream mixed with image spans: what --image-fraction and its companions set.
struct ModalityMix {
    double image_fraction = 0;  // share of the stream's tokens in image spans, markers included
    double image_entropy = 3;   // bits per code
    int64_t image_size = 6;     // N
    int64_t image_codes = 64;   // K

    void validate() const;
    // The image source these settings ask for: validated, τ from temperature_for_entropy.
    ImageSource image_source() const;
};

// The ids of a mixed vocabulary: the text tokenizer's [0, V), then the K codes, [BOI], [EOI].
// The markers count as text: what a position "is" (a query's or a key's modality) is image only
// for the codes.
struct ModalityVocab {
    int64_t text_vocab = 0;
    int64_t codes = 0;

    int64_t first_code() const { return text_vocab; }
    int32_t boi() const { return static_cast<int32_t>(text_vocab + codes); }
    int32_t eoi() const { return static_cast<int32_t>(text_vocab + codes + 1); }
    int64_t size() const { return text_vocab + codes + 2; }
    bool is_image(int32_t id) const { return id >= text_vocab && id < text_vocab + codes; }
};

// What mix_modalities made: the stream and what it holds.
struct MixedStream {
    struct Summary {
        int64_t tokens = 0, text_tokens = 0, images = 0;
        double temperature = 0;  // τ of the image source
        double image_bits = 0;   // the entropy the images were drawn with (draw_image's sum)

        double image_token_share() const;  // tokens in spans (markers included) / all
        double bits_per_code(int64_t image_size) const;
    };
    std::vector<int32_t> tokens;
    Summary summary;
};

// The text tokens, in order, cut into segments whose lengths are geometric with the mean that
// gives the image fraction, an image span of `images` ([BOI], N² codes, [EOI]) after each segment
// but the last. The image codes come from `seed` (train and validation use different seeds, so
// they hold different images). Fraction 0: the text alone.
MixedStream mix_modalities(const std::vector<int32_t>& text, const ModalityVocab& vocab,
                           double image_fraction, const ImageSource& images, uint64_t seed);

// One line for the start of a run: "images: 50.1 % of the training tokens, 14,085 images of 6x6
// codes (K = 64), 3.000 bits per code (tau 0.84)".
std::string describe_mix(const ModalityMix& mix, const MixedStream::Summary& summary);

// The tokenizer of a mixed stream: the text tokenizer's ids and the K codes and two markers
// after them. encode is the text tokenizer's ("[BOI]" and "[EOI]" parse as the markers when
// special tokens are parsed); decode shows a code as one character of a dark-to-light ramp
// (" .:-=+*#%@", code · 10 / K: a view, not an inverse) and the markers as "[BOI]" and "[EOI]".
// Saved in checkpoints as "mixed:<K>:" + the text tokenizer's serialize().
Tokenizer mixed_tokenizer(const Tokenizer& text, int64_t codes);
// Tokenizer::serialize and deserialize's "mixed:" form.
std::string serialize_mixed(const Tokenizer& t);
Tokenizer deserialize_mixed(const std::string& s);
// The vocabulary of a mixed tokenizer, or text_vocab = 0 when `t` is not one.
ModalityVocab modality_vocab(const Tokenizer& t);

}  // namespace qk::nn
