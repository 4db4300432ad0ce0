// Faults and hostile values below the command line: configuration checks, NaN propagation
// through the ops and the sampler, divergence by a loss spike, restarts after a kill, leftovers,
// corrupt metrics and state files, and plots of runs with nothing finite to draw.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>

#include "core/safetensors.h"
#include "helpers.h"
#include "nn/model/sample.h"
#include "nn/signals/plot.h"
#include "nn/train/checkpoint.h"
#include "nn/train/trainer.h"
#include "train_helpers.h"

using namespace qk;
using namespace qk::nn;
using namespace qk::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The suites' tiny run, with a checkpoint at every step and fewer, cheaper evaluations.
TrainConfig faults_run(const TempDir& dir, const std::string& name) {
    TrainConfig c = tiny_run(dir, name);
    c.steps = 12, c.warmup = 2, c.eval_every = 4, c.eval_batches = 1;
    c.checkpoint_every = 1, c.keep_checkpoints = 100, c.sample_tokens = 0;
    return c;
}

bool all_nan(const std::vector<double>& v) {
    for (double x : v)
        if (!std::isnan(x)) return false;
    return true;
}

}  // namespace

TEST_CASE("TrainConfig::validate names the flag, the value and the range") {
    struct Case {
        std::function<void(TrainConfig&)> set;
        std::vector<std::string> fragments;
    };
    const std::vector<Case> cases{
        {[](TrainConfig& c) { c.lr = -0.003; }, {"--lr", "-0.003"}},
        {[](TrainConfig& c) { c.lr = NAN; }, {"--lr", "nan"}},
        {[](TrainConfig& c) { c.beta1 = 2; }, {"--beta1", "2", "[0, 1)"}},
        {[](TrainConfig& c) { c.beta2 = 1; }, {"--beta2", "1"}},
        {[](TrainConfig& c) { c.weight_decay = -1; }, {"--weight-decay", "-1"}},
        {[](TrainConfig& c) { c.warmup = -10; }, {"--warmup", "-10"}},
        {[](TrainConfig& c) { c.grad_clip = -1; }, {"--grad-clip", "-1"}},
        {[](TrainConfig& c) { c.lr_min = 2 * c.lr; }, {"--lr-min", "[0, --lr]"}},
        {[](TrainConfig& c) { c.steps = 0; }, {"--steps", "0"}},
        {[](TrainConfig& c) { c.diverge_factor = 1; }, {"--diverge-factor", "1"}},
        {[](TrainConfig& c) { c.sample_tokens = kMaxSampleTokens + 1; }, {"--sample-tokens"}},
        {[](TrainConfig& c) { c.model.logit_softcap = INFINITY; }, {"--logit-softcap", "inf"}},
        {[](TrainConfig& c) { c.model.z_loss = INFINITY; }, {"--z-loss", "inf"}},
        {[](TrainConfig& c) { c.model.lp_p = INFINITY; }, {"--lp-p", "inf"}},
        {[](TrainConfig& c) { c.model.n_layer = 1 << 30; }, {"--n-layer", "[1, 1024]"}},
        {[](TrainConfig& c) { c.model.qk_norm = QKNorm::l2, c.model.qk_scale_init = "inf"; },
         {"--qk-scale-init", "inf"}},
    };
    for (const Case& c : cases) {
        TrainConfig cfg;
        cfg.validate();  // the defaults are valid
        c.set(cfg);
        CAPTURE(c.fragments[0]);
        CHECK_THROWS_AS(cfg.validate(), Error);
        const std::string what = qk::test::error_message([&] { cfg.validate(); });
        for (const std::string& f : c.fragments)
            CHECK_MESSAGE(what.find(f) != std::string::npos, what);
    }
}

TEST_CASE("a config.json with out-of-range or mistyped integers is refused") {
    const json good = json::parse(TrainConfig().to_json());
    TrainConfig::from_json(good.dump());
    auto with = [&](const char* key, json value) {
        json j = good;
        j[key] = value;
        return j.dump();
    };
    CHECK(throws_with([&] { TrainConfig::from_json(with("seed", -1)); }, {"seed", "-1"}));
    CHECK(throws_with([&] { TrainConfig::from_json(with("steps", 2.5)); }, {"steps", "2.5"}));
    CHECK(throws_with([&] { TrainConfig::from_json(with("steps", 1e30)); }, {"steps"}));
    CHECK(throws_with([&] { TrainConfig::from_json(with("lr", -1)); }, {"--lr", "-1"}));
    CHECK(throws_with([&] { TrainConfig::from_json("[1, 2]"); }, {"JSON object"}));
    CHECK(throws_with([&] { TrainConfig::from_json(std::string(1'000'000, '[')); },
                      {"1000000 levels deep"}));
}

// A configuration whose model values are not the defaults, with a double that only a shortest
// round-trip form reads back to the same bits.
TrainConfig typed_config() {
    TrainConfig c;
    c.model.n_layer = 3, c.model.dropout = 0.1 + 0.2, c.model.bias = false;
    c.model.pos_emb = PosEmb::rope, c.model.rope_theta = 500000, c.lr = 3e-4;
    c.validate();
    return c;
}

TEST_CASE("config.json holds the model's numbers as numbers and its switches as booleans") {
    const TrainConfig c = typed_config();
    const json j = json::parse(c.to_json());
    const json& m = j.at("model");
    CHECK(m.at("n_layer").is_number_integer());
    CHECK(m.at("n_layer") == 3);
    CHECK(m.at("vocab_size").is_number_integer());
    CHECK(m.at("dropout").is_number_float());
    CHECK(m.at("dropout").get<double>() == c.model.dropout);
    CHECK(m.at("rope_theta") == 500000.0);
    CHECK(m.at("bias").is_boolean());
    CHECK(m.at("bias") == false);
    CHECK(m.at("tie_embeddings").is_boolean());
    // The names stay strings, and nothing else is one.
    const std::set<std::string> names{
        "norm",    "qk_norm",       "qk_norm_scope", "qk_scale_init",  "attention",  "precision",
        "pos_emb", "qk_norm_order", "mlp",           "norm_placement", "layer_types"};
    for (const auto& [key, value] : m.items()) {
        CAPTURE(key);
        CHECK(value.is_string() == (names.count(key) == 1));
    }
    const TrainConfig back = TrainConfig::from_json(c.to_json());
    CHECK(back.to_json() == c.to_json());
    CHECK(back.model.dropout == c.model.dropout);  // the same bits
    CHECK(back.model.n_layer == 3);
    CHECK(!back.model.bias);
}

TEST_CASE("a config.json of before typed values (every model value a string) still loads") {
    const TrainConfig c = typed_config();
    json old = json::parse(c.to_json());
    old["model"] = c.model.to_strings();  // what config.json held until then
    REQUIRE(old["model"]["n_layer"] == "3");
    REQUIRE(old["model"]["bias"] == "false");
    CHECK(TrainConfig::from_json(old.dump()).to_json() == c.to_json());
    // A mix of the two forms reads too (a hand-edited file).
    json mixed = json::parse(c.to_json());
    mixed["model"]["n_embd"] = std::to_string(c.model.n_embd);
    mixed["model"]["qkv_norm"] = "false";
    CHECK(TrainConfig::from_json(mixed.dump()).to_json() == c.to_json());
    // Neither form: refused, naming the field.
    auto with_model = [&](const char* key, json value) {
        json j = json::parse(c.to_json());
        j["model"][key] = value;
        return j.dump();
    };
    CHECK(throws_with([&] { TrainConfig::from_json(with_model("n_layer", nullptr)); },
                      {"model.n_layer"}));
    CHECK(throws_with([&] { TrainConfig::from_json(with_model("bias", 1)); }, {"bias"}));
    CHECK(throws_with([&] { TrainConfig::from_json(with_model("n_layer", 2.5)); }, {"n_layer"}));
}

TEST_CASE("thread counts are bounded") {
    CHECK(throws_with([] { set_num_threads(100000); }, {"100000", "[1, 1024]"}));
    CHECK(parse_thread_count("2", "t") == 2);
    for (const char* bad : {"0", "-1", "two", "2x", "", "100000"})
        CHECK(throws_with([&] { parse_thread_count(bad, "QK_NUM_THREADS"); }, {"QK_NUM_THREADS"}));
}

TEST_CASE("softmax: a NaN or +inf among the visible logits makes the row NaN, never finite") {
    for (bool is_log : {false, true})
        for (DType dtype : {kF32, kF64}) {
            CAPTURE(is_log);
            // Row 0 all NaN (it used to come out as zeros), row 1 one NaN, row 2 one +inf,
            // row 3 clean.
            std::vector<double> x{NAN, NAN, NAN, 1, NAN, 2, 1, INFINITY, 2, 1, 2, 3};
            Tensor t = from_vector(x, {4, 3}, dtype).requires_grad_();
            Tensor y = is_log ? log_softmax(t) : softmax(t);
            const std::vector<double> out = y.to_vector<double>();
            for (int r = 0; r < 3; ++r)
                CHECK(all_nan(std::vector<double>(out.begin() + 3 * r, out.begin() + 3 * r + 3)));
            for (int j = 9; j < 12; ++j) CHECK(std::isfinite(out[j]));
            sum(y * from_vector(std::vector<double>(12, 0.5), {4, 3}, dtype)).backward();
            const std::vector<double> dx = t.grad().to_vector<double>();
            CHECK(all_nan(std::vector<double>(dx.begin(), dx.begin() + 9)));
            for (int j = 9; j < 12; ++j) CHECK(std::isfinite(dx[j]));
        }
}

TEST_CASE("softmax: a NaN under the causal mask is not seen, a visible one is") {
    // (1, 3, 3) causal: row 0 sees key 0 only; a NaN at key 2 of row 0 is masked out.
    std::vector<double> x{1, 5, NAN, 1, 2, 3, 1, NAN, 3};
    Tensor y = softmax(from_vector(x, {1, 3, 3}, kF64), {.causal = true});
    const std::vector<double> out = y.to_vector<double>();
    CHECK(out[0] == 1.0);
    CHECK(out[1] == 0.0);
    CHECK(out[2] == 0.0);
    CHECK(all_nan({out[6], out[7], out[8]}));  // row 2 sees its NaN
}

TEST_CASE("norms and cross-entropy carry a NaN through to the loss") {
    Tensor x = from_vector(std::vector<double>{1, 2, 3, NAN, 1, 2, 3, 4}, {2, 4}, kF64);
    Tensor w = ones({4}, kF64), b = zeros({4}, kF64);
    const std::vector<double> ln = layer_norm(x, w, b, 1e-5).to_vector<double>();
    const std::vector<double> rms = rms_norm(x, w, 1e-5).to_vector<double>();
    CHECK(all_nan(std::vector<double>(ln.begin(), ln.begin() + 4)));
    CHECK(all_nan(std::vector<double>(rms.begin(), rms.begin() + 4)));
    for (int j = 4; j < 8; ++j) CHECK((std::isfinite(ln[j]) && std::isfinite(rms[j])));
    Tensor targets = from_ids({0, 1}, {2});
    CHECK(std::isnan(cross_entropy(x, targets).item()));
}

TEST_CASE("the stability signals report a NaN in the attention instead of skipping it") {
    GPTConfig c;
    c.vocab_size = 9, c.block_size = 4, c.n_layer = 1, c.n_head = 2, c.n_embd = 8;
    GPT model(c, 3);
    Tensor ids = from_ids({1, 2, 3, 4}, {1, 4});
    CHECK(std::isfinite(model.forward(ids, ids, /*with_stats=*/true).stats.at(0).max_logit));
    {
        NoGradGuard no_grad;
        model.parameters()[0].data<float>()[2 * 8] = NAN;  // token 2's embedding
    }
    const GPTOutput out = model.forward(ids, ids, true);
    CHECK(std::isnan(out.stats.at(0).max_logit));
    CHECK(std::isnan(out.stats.at(0).entropy));
    CHECK(std::isnan(out.loss.item()));
}

TEST_CASE("generate refuses non-finite logits and bad options, and streams every token") {
    GPTConfig c;
    c.vocab_size = 9, c.block_size = 4, c.n_layer = 1, c.n_head = 2, c.n_embd = 8;
    GPT model(c, 3);
    Generator gen(1);
    std::vector<int32_t> streamed;
    const auto ids =
        generate(model, {1, 2}, {.max_new_tokens = 6, .temperature = 1.0}, gen, [&](int32_t id) {
            streamed.push_back(id);
            return true;
        });
    CHECK(streamed == std::vector<int32_t>(ids.begin() + 2, ids.end()));
    CHECK(throws_with([&] { generate(model, {1}, {.temperature = NAN}, gen); },
                      {"--temperature", "nan"}));
    CHECK(throws_with([&] { generate(model, {1}, {.max_new_tokens = kMaxSampleTokens + 1}, gen); },
                      {"--tokens"}));
    CHECK(throws_with([&] { generate(model, {1}, {.top_k = -1}, gen); }, {"--top-k"}));
    {
        NoGradGuard no_grad;
        model.parameters()[0].data<float>()[0] = NAN;  // a NaN in the token embedding of id 0
    }
    CHECK(throws_with([&] { generate(model, {0}, {.max_new_tokens = 3}, gen); }, {"not finite"}));
}

TEST_CASE("a loss spike stops the run, and no checkpoint of the blown-up weights is kept") {
    TempDir dir("faults_spike");
    TrainConfig cfg = faults_run(dir, "run");
    train(cfg, false, {.kill_after = 5});  // killed after step 5: checkpoints 1-4 are vouched for
    TrainConfig hot = load_run_config(cfg.run_dir);
    hot.lr = hot.lr_min = 1e6, hot.progress = false;
    const TrainResult r = train(hot, /*resume=*/true);
    REQUIRE(r.diverged);
    CAPTURE(r.message);
    CHECK(r.message.find("above 3 x the lowest loss") != std::string::npos);
    // Resumed from checkpoint 4: step 5's loss (on those weights) passed, its update at lr 1e6
    // blew the weights up, and step 6's loss said so: checkpoint 5 was never written.
    CHECK(r.steps_done == 5);
    CHECK(latest_model_checkpoint(cfg.run_dir) == cfg.run_dir + "/step-000004.model.safetensors");
    const std::string last = read_file(cfg.run_dir + "/metrics.jsonl");
    CHECK(last.find("\"reason\"") != std::string::npos);
}

TEST_CASE("a run killed before its first checkpoint starts again in place; leftovers are removed") {
    TempDir dir("faults_restart");
    TrainConfig cfg = faults_run(dir, "run");
    cfg.checkpoint_every = 100;
    train(cfg, false, {.kill_after = 3});  // killed at step 3, no checkpoint yet
    REQUIRE(latest_model_checkpoint(cfg.run_dir).empty());
    // What kills leave behind: a temporary of a process that is gone, a state file whose model
    // was never written.
    std::ofstream(cfg.run_dir + "/step-000002.model.safetensors.tmp.99999999") << "partial";
    std::ofstream(cfg.run_dir + "/step-000002.state.safetensors") << "orphan";
    const TrainResult fresh = train(cfg);  // no --resume: allowed, nothing would be lost
    CHECK(fresh.steps_done == cfg.steps);
    CHECK(!fs::exists(cfg.run_dir + "/step-000002.model.safetensors.tmp.99999999"));
    CHECK(!fs::exists(cfg.run_dir + "/step-000002.state.safetensors"));
    CHECK(throws_with([&] { train(cfg); }, {"already holds a run", "--resume"}));
}

TEST_CASE("resume drops malformed metrics lines and refuses a corrupt step") {
    TempDir dir("faults_resume");
    TrainConfig cfg = faults_run(dir, "run");
    train(cfg, false, {.kill_after = 4});
    {
        std::ofstream metrics(cfg.run_dir + "/metrics.jsonl", std::ios::app);
        metrics << "{\"step\": \"x\"}\n42\n{\"step\": 5, \"loss\": 1.0\n";  // last: cut by a kill
    }
    TrainConfig again = load_run_config(cfg.run_dir);
    again.progress = false;
    CHECK(train(again, true).steps_done == cfg.steps);
    for (const std::string bad : {"-1", "12abc", "99999999999999999999"}) {
        CAPTURE(bad);
        const std::string state = cfg.run_dir + "/step-000012.state.safetensors";
        SafetensorsFile file = load_safetensors(state);
        file.metadata["step"] = bad;
        save_safetensors(state + ".edited", file.tensors, file.metadata);
        fs::rename(state + ".edited", state);
        CHECK(throws_with([&] { train(again, true); }, {"step", bad}));
    }
}

namespace {

size_t count_of(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

bool has_tick(const plot::AxisTicks& a, double v) {
    return std::any_of(a.ticks.begin(), a.ticks.end(),
                       [&](double t) { return std::abs(t - v) <= 1e-9 * v; });
}

// The ticks are increasing, inside the axis, and the axis holds [lo, hi] with a tick at or beyond
// each end.
void check_covers(const plot::AxisTicks& a, double lo, double hi) {
    CAPTURE(lo);
    CAPTURE(hi);
    REQUIRE(a.ticks.size() >= 2);
    CHECK(std::is_sorted(a.ticks.begin(), a.ticks.end()));
    CHECK(a.lo <= lo);
    CHECK(a.hi >= hi);
    CHECK(a.ticks.front() <= lo * (1 + 1e-9));
    CHECK(a.ticks.back() >= hi * (1 - 1e-9));
    CHECK(a.ticks.front() >= a.lo);
    CHECK(a.ticks.back() <= a.hi);
}

}  // namespace

TEST_CASE("log axes: a tick every decade across the range, with 2 and 5 under two decades") {
    // Five decades of a gradient norm: every power of ten from 1e-4 to 10 is a tick.
    const plot::AxisTicks wide = plot::axis_ticks(2e-4, 7, true, 11);
    check_covers(wide, 2e-4, 7);
    for (int d = -4; d <= 1; ++d) CHECK_MESSAGE(has_tick(wide, std::pow(10.0, d)), d);
    CHECK(wide.ticks.size() <= 11);
    // Under two decades: intermediate ticks at 2 and 5 (or denser).
    const plot::AxisTicks narrow = plot::axis_ticks(0.3, 8, true, 11);
    check_covers(narrow, 0.3, 8);
    for (double v : {0.5, 1.0, 2.0, 5.0}) CHECK_MESSAGE(has_tick(narrow, v), v);
    // One decade on an axis of 8 labels: 3 4 5 7 10 … would crowd 4 and 5, so 2 5 10 20 50.
    const plot::AxisTicks decade = plot::axis_ticks(0.003, 0.03, true, 8);
    check_covers(decade, 0.003, 0.03);
    CHECK(has_tick(decade, 0.01));
    for (size_t i = 1; i < decade.ticks.size(); ++i)
        CHECK(std::log10(decade.ticks[i] / decade.ticks[i - 1]) >=
              0.75 * std::log10(decade.hi / decade.lo) / 7);
    // Hundreds of decades: one tick every few, still across the whole range and bounded.
    const plot::AxisTicks huge = plot::axis_ticks(1e-200, 1e200, true, 8);
    check_covers(huge, 1e-200, 1e200);
    CHECK(huge.ticks.size() <= 8);
    // A linear axis keeps the data's range, its ticks round and inside it.
    const plot::AxisTicks linear = plot::axis_ticks(0, 9000, false, 11);
    CHECK(linear.lo == 0);
    CHECK(linear.hi == 9000);
    CHECK(has_tick(linear, 0));
    CHECK(has_tick(linear, 9000));
}

TEST_CASE("a plot has a title, log axes say so, and sparse series get a marker per point") {
    plot::Series train{"train", {1, 2, 3, 4, 5, 6}, {4, 3.5, 3, 2.8, 2.6, 2.5}};
    plot::Series val{"val", {0, 3, 6}, {4.2, 3.1, 2.6}, true};
    plot::Panel loss{"Loss", "step", "cross-entropy", false, false, {train, val}};
    plot::Panel grad{"Gradient norm", "step", "‖g‖",
                     false,           true,   {{"g", {1, 2, 3}, {5, 0.5, 0.05}}}};
    const std::string svg = plot::render_svg({loss, grad}, 2, "run-a: L=4 H=6\nB=16, 9000 steps");
    CHECK(count_of(svg, "<circle") == 3 + 1);  // the three val points and the legend's dot
    CHECK(count_of(svg, "‖g‖ (log scale)") == 1);
    CHECK(count_of(svg, "cross-entropy (log scale)") == 0);
    CHECK(count_of(svg, ">run-a: L=4 H=6</text>") == 1);
    CHECK(count_of(svg, ">B=16, 9000 steps</text>") == 1);
    // The log axis from 0.05 to 5: its decades and their 2 and 5 as ticks, the ends included.
    for (const std::string tick : {"0.05", "0.1", "0.2", "0.5", "1", "2", "5"})
        CHECK_MESSAGE(count_of(svg, "text-anchor=\"end\">" + tick + "</text>") == 1, tick);
    // Without markers or a title, none is drawn.
    const std::string plain = plot::render_svg({{"Loss", "step", "loss", false, false, {train}}});
    CHECK(count_of(plain, "<circle") == 0);
    CHECK(count_of(plain, "font-size=\"15\"") == 0);
}

// The number after `key="` at each occurrence in svg.
std::vector<double> attribute_values(const std::string& svg, const std::string& key) {
    std::vector<double> values;
    const std::string what = key + "=\"";
    for (size_t at = svg.find(what); at != std::string::npos; at = svg.find(what, at + 1))
        values.push_back(std::stod(svg.substr(at + what.size())));
    return values;
}

TEST_CASE("a plot of a 25-variant sweep keeps its legend on the page, each line its own style") {
    plot::Panel panel{"Final validation loss against learning rate", "lr", "loss", true, false, {}};
    for (int k = 0; k < 25; ++k)
        panel.series.push_back({fmt::format("baseline:clip=100:precision=fp8:fp8attn=1 #{}", k),
                                {1e-3, 1e-2},
                                {2.0 + k, 1.0 + k}});
    const std::string svg = plot::render_svg({panel}, 1);
    const double width = attribute_values(svg, "width").front(),
                 height = attribute_values(svg, "height").front();
    // Legend rows: each label's baseline inside the page, and the longest label (45 characters
    // at ~6.6 px) ending inside it too.
    size_t labels = 0;
    for (size_t at = svg.find("font-size=\"11\">baseline:clip"); at != std::string::npos;
         at = svg.find("font-size=\"11\">baseline:clip", at + 1), ++labels) {
        const size_t text = svg.rfind("<text x=\"", at);
        const double x = std::stod(svg.substr(text + 9)),
                     y = std::stod(svg.substr(svg.find("y=\"", text) + 3));
        CHECK(y < height);
        CHECK(x + 45 * 6.6 <= width);
    }
    CHECK(labels == 25);
    // 25 lines, no two with the same colour and dash pattern.
    std::set<std::string> styles;
    for (size_t at = svg.find("<polyline"); at != std::string::npos;
         at = svg.find("<polyline", at + 1))
        styles.insert(svg.substr(at, svg.find(" stroke-width", at) - at));
    CHECK(styles.size() == 25);
    // A plot of a few short labels keeps the usual size.
    const std::string small =
        plot::render_svg({{"loss", "step", "loss", false, false, {{"a", {0, 1}, {1, 2}}}}});
    CHECK(small.find(R"(width="520" height="330")") != std::string::npos);
}

TEST_CASE("plots of runs with nothing finite to draw finish and stay small") {
    plot::Panel empty_log{"max logit", "step", "|s|",
                          false,       true,   {{"layer 0", {1, 2}, {NAN, INFINITY}}}};
    plot::Panel empty{"loss", "step", "loss", false, false, {}};
    plot::Panel huge{"wide", "step", "x", true, true, {{"a", {1e-300, 1e300}, {1e-300, 1e300}}}};
    const std::string svg = plot::render_svg({empty_log, empty, huge});
    CHECK(svg.rfind("<svg", 0) == 0);
    CHECK(svg.size() < 200'000);
    CHECK(svg.find("nan") == std::string::npos);
}
