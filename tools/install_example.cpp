// A program outside the source tree, built against an installed qknorm with nothing but
//   c++ install_example.cpp $(pkg-config --cflags --libs qk)
// (tools/install_check.sh). It touches each layer a user would: tensors, autograd, an nn layer,
// a whole GPT with an optimiser step, and the bundled data. Exit status 0 when every number is
// what it should be.
#include <qk/nn.h>  // the nn layer and, under it, <qk/qk.h>

#include <cmath>
#include <cstdio>

using namespace qk;

namespace {

int failures = 0;

void expect(bool ok, const char* what, double value) {
    std::printf("%-44s %.6g  %s\n", what, value, ok ? "ok" : "WRONG");
    if (!ok) ++failures;
}

}  // namespace

int main() {
    Generator gen(1);

    // Autograd through a Linear layer: d/dx sum(W x + b) = column sums of W.
    nn::Linear layer(3, 2, /*bias=*/true, /*init_std=*/0.5, gen);
    Tensor x = from_vector({1.0, -2.0, 0.5}, {1, 3});
    x.requires_grad_();
    sum(layer.forward(x)).backward();
    double worst = 0;
    for (int64_t j = 0; j < 3; ++j) {
        const double want = layer.weight.at({0, j}) + layer.weight.at({1, j});
        worst = std::max(worst, std::abs(x.grad().at({0, j}) - want));
    }
    expect(worst < 1e-6, "Linear: |dx - column sums of W|", worst);
    expect(layer.bias.grad().at({0}) == 1.0, "Linear: d/db", layer.bias.grad().at({0}));

    // A tiny QK-norm GPT: the first loss is about ln(vocab), and one AdamW step lowers it.
    nn::GPTConfig config;
    config.vocab_size = 16;
    config.block_size = 8;
    config.n_layer = 2;
    config.n_head = 2;
    config.n_embd = 16;
    config.qk_norm = nn::QKNorm::rmsnorm;
    nn::GPT model(config, /*seed=*/3);
    Tensor ids = Tensor::empty({2, 8}, kI32), targets = Tensor::empty({2, 8}, kI32);
    for (int64_t b = 0; b < 2; ++b)
        for (int64_t t = 0; t < 8; ++t) {
            ids.set({b, t}, (3 * b + t) % 16);
            targets.set({b, t}, (3 * b + t + 1) % 16);
        }
    nn::AdamW optimizer(model.parameters(), nn::AdamWOptions{});
    const double loss0 = model.forward(ids, targets).loss.item();
    expect(std::abs(loss0 - std::log(16.0)) < 0.5, "GPT: first loss (ln 16 = 2.77)", loss0);
    for (int step = 0; step < 5; ++step) {
        optimizer.zero_grad();
        model.forward(ids, targets).loss.backward();
        optimizer.step(1e-2);
    }
    const double loss5 = model.forward(ids, targets).loss.item();
    expect(loss5 < loss0 - 0.1, "GPT: loss after 5 AdamW steps", loss5);

    // The bundled data (the qknorm program's default --data), found without the source tree.
    try {
        std::printf("default data: %s\n", nn::default_data_path().c_str());
    } catch (const Error& e) {
        std::printf("default data: not found (%s)\n", e.what());
    }

    std::printf("%s\n", failures == 0 ? "install example: ok" : "install example: FAILED");
    return failures == 0 ? 0 : 1;
}
