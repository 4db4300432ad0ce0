#include "nn/model/config.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace qk::nn {

namespace {

template <typename Enum, size_t N>
Enum parse_enum(const std::string& s, const std::array<std::pair<const char*, Enum>, N>& names,
                const char* what) {
    std::string valid;
    for (const auto& [name, value] : names) {
        if (s == name) return value;
        valid += (valid.empty() ? "" : ", ") + std::string(name);
    }
    throw Error(fmt::format("config: unknown {} '{}' (expected one of: {})", what, s, valid));
}

constexpr double kMinSoftcap = 0.1, kMaxSoftcap = 1e6;  // the soft-caps' range when on

constexpr std::array<std::pair<const char*, QKNorm>, 5> kQKNorms{{{"none", QKNorm::none},
                                                                  {"layernorm", QKNorm::layernorm},
                                                                  {"rmsnorm", QKNorm::rmsnorm},
                                                                  {"l2", QKNorm::l2},
                                                                  {"lp", QKNorm::lp}}};
constexpr std::array<std::pair<const char*, NormScope>, 2> kScopes{
    {{"head", NormScope::head}, {"full", NormScope::full}}};
constexpr std::array<std::pair<const char*, NormKind>, 2> kNormKinds{
    {{"layernorm", NormKind::layernorm}, {"rmsnorm", NormKind::rmsnorm}}};
constexpr std::array<std::pair<const char*, PosEmb>, 2> kPosEmbs{
    {{"learned", PosEmb::learned}, {"rope", PosEmb::rope}}};
constexpr std::array<std::pair<const char*, QKNormOrder>, 2> kQKNormOrders{
    {{"before_rope", QKNormOrder::before_rope}, {"after_rope", QKNormOrder::after_rope}}};
constexpr std::array<std::pair<const char*, MLPKind>, 3> kMLPKinds{
    {{"gelu", MLPKind::gelu}, {"swiglu", MLPKind::swiglu}, {"geglu", MLPKind::geglu}}};
constexpr std::array<std::pair<const char*, NormPlacement>, 3> kNormPlacements{
    {{"pre", NormPlacement::pre}, {"post", NormPlacement::post}, {"both", NormPlacement::both}}};
constexpr std::array<std::pair<const char*, Precision>, 4> kPrecisions{{{"fp32", Precision::full},
                                                                        {"bf16", Precision::bf16},
                                                                        {"fp16", Precision::fp16},
                                                                        {"fp8", Precision::fp8}}};

template <typename Enum, size_t N>
std::string enum_name(Enum v, const std::array<std::pair<const char*, Enum>, N>& names) {
    for (const auto& [name, value] : names)
        if (value == v) return name;
    return "?";
}

// "attn_softcap (--attn-softcap)": a field as checkpoints and config.json name it, and its flag.
std::string with_flag(const char* field) {
    std::string flag = field;
    std::replace(flag.begin(), flag.end(), '_', '-');
    return fmt::format("{} (--{})", field, flag);
}

double parse_number(const std::string& s, const char* field) {
    try {
        size_t used = 0;
        double v = std::stod(s, &used);
        if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
    throw Error(fmt::format("config: {} must be a number, got '{}'", field, s));
}

// Whole numbers only: "2.5" or "1e30" for a layer count is a corrupt config, not a rounding.
int64_t parse_integer(const std::string& s, const char* field) {
    try {
        size_t used = 0;
        const long long v = std::stoll(s, &used);
        if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
    throw Error(fmt::format("config: {} must be an integer, got '{}'", field, s));
}

// "sliding,full" -> {"sliding", "full"}; "" -> {}.
std::vector<std::string> split_commas(const std::string& s) {
    std::vector<std::string> parts;
    if (s.empty()) return parts;
    size_t begin = 0;
    for (size_t comma; (comma = s.find(',', begin)) != std::string::npos; begin = comma + 1)
        parts.push_back(s.substr(begin, comma - begin));
    parts.push_back(s.substr(begin));
    return parts;
}

}  // namespace

std::string to_string(QKNorm v) { return enum_name(v, kQKNorms); }
std::string to_string(NormScope v) { return enum_name(v, kScopes); }
std::string to_string(NormKind v) { return enum_name(v, kNormKinds); }
QKNorm parse_qk_norm(const std::string& s) { return parse_enum(s, kQKNorms, "qk_norm"); }
NormScope parse_norm_scope(const std::string& s) { return parse_enum(s, kScopes, "qk_norm_scope"); }
NormKind parse_norm_kind(const std::string& s) { return parse_enum(s, kNormKinds, "norm"); }
std::string to_string(Precision v) { return enum_name(v, kPrecisions); }
std::string to_string(PosEmb v) { return enum_name(v, kPosEmbs); }
std::string to_string(QKNormOrder v) { return enum_name(v, kQKNormOrders); }
PosEmb parse_pos_emb(const std::string& s) { return parse_enum(s, kPosEmbs, "pos_emb"); }
std::string to_string(MLPKind v) { return enum_name(v, kMLPKinds); }
MLPKind parse_mlp_kind(const std::string& s) { return parse_enum(s, kMLPKinds, "mlp"); }
std::string to_string(NormPlacement v) { return enum_name(v, kNormPlacements); }
NormPlacement parse_norm_placement(const std::string& s) {
    return parse_enum(s, kNormPlacements, "norm_placement");
}
QKNormOrder parse_qk_norm_order(const std::string& s) {
    return parse_enum(s, kQKNormOrders, "qk_norm_order");
}
Precision parse_precision(const std::string& s) { return parse_enum(s, kPrecisions, "precision"); }

bool GPTConfig::is_sliding(int64_t layer) const {
    if (sliding_window == 0) return false;
    const std::vector<std::string> types = split_commas(layer_types);
    return types.empty() || types.at(static_cast<size_t>(layer)) == "sliding";
}

double GPTConfig::initial_qk_scale() const {
    if (qk_scale_init == "henry") {
        const double t = static_cast<double>(block_size);
        return std::log2(t * t - t);
    }
    if (qk_scale_init == "sqrt_d") return std::sqrt(static_cast<double>(head_dim()));
    return parse_number(qk_scale_init, "qk_scale_init (henry, sqrt_d or a number)");
}

void GPTConfig::validate() const {
    // Upper bounds far above any model this code trains, low enough that no size product
    // overflows and a typo (1e9 layers) is named instead of ending in an out-of-memory abort.
    auto in_range = [](int64_t v, int64_t hi, const char* name) {
        QK_CHECK(v > 0 && v <= hi, "config: {} must be in [1, {}], got {}", with_flag(name), hi, v);
    };
    QK_CHECK(vocab_size > 0 && vocab_size <= int64_t{1} << 24,
             "config: vocab_size must be in [1, 2^24], got {}", vocab_size);
    in_range(block_size, int64_t{1} << 20, "block_size");
    in_range(n_layer, 1024, "n_layer");
    in_range(n_embd, int64_t{1} << 16, "n_embd");
    in_range(n_head, 1 << 14, "n_head");
    QK_CHECK(head_size > 0 || n_embd % n_head == 0,
             "config: n_embd {} must be divisible by n_head {} (or head_size set)", n_embd, n_head);
    QK_CHECK(head_size >= 0 && head_size <= 1 << 14,
             "config: {} must be 0 (n_embd / n_head) or a width in [1, 2^14], got {}",
             with_flag("head_size"), head_size);
    QK_CHECK(n_kv_head >= 0 && n_kv_head <= n_head && n_head % kv_heads() == 0,
             "config: {} must be 0 (= n_head) or divide n_head {}, got {}", with_flag("n_kv_head"),
             n_head, n_kv_head);
    QK_CHECK(std::isfinite(norm_eps) && norm_eps > 0 && norm_eps <= 1,
             "config: {} must be in (0, 1], got {}", with_flag("norm_eps"), norm_eps);
    QK_CHECK(std::isfinite(embedding_scale) && embedding_scale > 0,
             "config: {} must be a finite number > 0, got {}", with_flag("embedding_scale"),
             embedding_scale);
    QK_CHECK(std::isfinite(query_pre_attn_scalar) && query_pre_attn_scalar >= 0,
             "config: {} must be 0 (head_dim) or a finite number > 0, got {}",
             with_flag("query_pre_attn_scalar"), query_pre_attn_scalar);
    QK_CHECK(rope_local_theta == 0 || (std::isfinite(rope_local_theta) && rope_local_theta > 1),
             "config: {} must be 0 (= rope_theta) or a finite number > 1, got {}",
             with_flag("rope_local_theta"), rope_local_theta);
    QK_CHECK(sliding_window >= 0 && sliding_window <= int64_t{1} << 20,
             "config: {} must be 0 (off) or a window in [1, 2^20], got {}",
             with_flag("sliding_window"), sliding_window);
    const std::vector<std::string> types = split_commas(layer_types);
    QK_CHECK(types.empty() || static_cast<int64_t>(types.size()) == n_layer,
             "config: {} must name one type per layer ({}), got {}: '{}'", with_flag("layer_types"),
             n_layer, types.size(), layer_types);
    for (const std::string& t : types) {
        QK_CHECK(t == "full" || t == "sliding",
                 "config: layer_types entries must be full or sliding, got '{}' in '{}'", t,
                 layer_types);
        QK_CHECK(t == "full" || sliding_window > 0,
                 "config: layer_types has sliding layers but sliding_window is 0 ('{}')",
                 layer_types);
    }
    QK_CHECK(dropout >= 0 && dropout < 1, "config: dropout (--dropout) must be in [0, 1), got {}",
             dropout);
    // p beyond 64 is the max-norm for every practical purpose, and |x|^p overflows long before.
    QK_CHECK(lp_p >= 1 && lp_p <= 64, "config: lp_p (--lp-p) must be in [1, 64], got {}", lp_p);
    // inf would turn every logit into NaN (c·tanh(s/c) = inf·0), and so would a cap that rounds
    // to 0 in float32 (1e-300); a cap below 0.1 leaves softmax nothing to tell apart. Gemma 2
    // caps at 50 (attention) and 30 (output).
    auto cap_or_off = [](double v, const char* name) {
        QK_CHECK(v == 0 || (std::isfinite(v) && v >= kMinSoftcap && v <= kMaxSoftcap),
                 "config: {} must be 0 (off) or a number in [{}, {:g}], got {}", with_flag(name),
                 kMinSoftcap, kMaxSoftcap, v);
    };
    cap_or_off(attn_softcap, "attn_softcap");
    cap_or_off(logit_softcap, "logit_softcap");
    // PaLM's weight is 1e-4; at 1 the z-loss already outweighs the cross-entropy.
    QK_CHECK(std::isfinite(z_loss) && z_loss >= 0 && z_loss <= 1,
             "config: {} must be a number in [0, 1] (0 = off), got {}", with_flag("z_loss"),
             z_loss);
    QK_CHECK(mlp_hidden >= 0 && mlp_hidden <= int64_t{1} << 18,
             "config: {} must be 0 (4 · n_embd) or a width in [1, 2^18], got {}",
             with_flag("mlp_hidden"), mlp_hidden);
    QK_CHECK(!fp8_attention || precision == Precision::fp8,
             "config: fp8_attention (--fp8-attention) needs precision fp8 (--precision fp8), got "
             "precision {}",
             to_string(precision));
    QK_CHECK(!qkv_norm || qk_norm != QKNorm::none,
             "config: qkv_norm needs a qk_norm to apply to v (got qk_norm=none)");
    QK_CHECK(block_size >= 2 || (qk_norm != QKNorm::l2 && qk_norm != QKNorm::lp) ||
                 qk_scale_init != "henry",
             "config: the henry scale log2(T²−T) needs block_size >= 2, got {}", block_size);
    QK_CHECK(pos_emb == PosEmb::learned || head_dim() % 2 == 0,
             "config: rope rotates pairs of a head's dimensions, so the head dim must be even, "
             "got {}",
             head_size > 0
                 ? fmt::format("head_size {}", head_size)
                 : fmt::format("n_embd / n_head = {} / {} = {}", n_embd, n_head, head_dim()));
    // Checked whether or not it is used: it is saved either way, and a NaN saved as JSON null
    // would make the run impossible to resume.
    QK_CHECK(std::isfinite(rope_theta) && rope_theta > 1,
             "config: rope_theta (--rope-theta) must be a finite number > 1, got {}", rope_theta);
    // after_rope normalises each head's rotated vector; a norm over the full width runs before
    // the heads are split, where there is nothing rotated yet.
    const bool norm_family = qk_norm == QKNorm::layernorm || qk_norm == QKNorm::rmsnorm;
    QK_CHECK(qk_norm_order == QKNormOrder::before_rope || pos_emb == PosEmb::rope,
             "config: qk_norm_order (--qk-norm-order) after_rope needs pos_emb rope");
    QK_CHECK(qk_norm_order == QKNormOrder::before_rope || !norm_family ||
                 qk_norm_scope == NormScope::head,
             "config: qk_norm_order after_rope needs qk_norm_scope head (a full-width norm runs "
             "before the heads exist to be rotated), got qk_norm_scope full");
    if (qk_scale_init != "henry" && qk_scale_init != "sqrt_d") {  // a number, used or not
        const double g0 = parse_number(qk_scale_init, "qk_scale_init (henry, sqrt_d or a number)");
        QK_CHECK(std::isfinite(g0) && g0 > 0,
                 "config: qk_scale_init (--qk-scale-init) must be henry, sqrt_d or a finite "
                 "number > 0, got '{}'",
                 qk_scale_init);
    }
    if (qk_norm == QKNorm::l2 || qk_norm == QKNorm::lp) {
        const double g0 = initial_qk_scale();
        QK_CHECK(
            std::isfinite(g0) && g0 > 0,
            "config: qk_scale_init (--qk-scale-init) must give a finite scale > 0, got {} ('{}')",
            g0, qk_scale_init);
    }
}

std::map<std::string, std::string> GPTConfig::to_strings() const {
    return {{"vocab_size", std::to_string(vocab_size)},
            {"block_size", std::to_string(block_size)},
            {"n_layer", std::to_string(n_layer)},
            {"n_head", std::to_string(n_head)},
            {"n_embd", std::to_string(n_embd)},
            {"n_kv_head", std::to_string(n_kv_head)},
            {"head_size", std::to_string(head_size)},
            {"norm_placement", to_string(norm_placement)},
            {"norm_eps", fmt::format("{}", norm_eps)},
            {"norm_unit_offset", norm_unit_offset ? "true" : "false"},
            {"embedding_scale", fmt::format("{}", embedding_scale)},
            {"rope_local_theta", fmt::format("{}", rope_local_theta)},
            {"sliding_window", std::to_string(sliding_window)},
            {"layer_types", layer_types},
            {"query_pre_attn_scalar", fmt::format("{}", query_pre_attn_scalar)},
            {"bias", bias ? "true" : "false"},
            {"tie_embeddings", tie_embeddings ? "true" : "false"},
            {"norm", to_string(norm)},
            {"dropout", fmt::format("{}", dropout)},
            {"qk_norm", to_string(qk_norm)},
            {"qk_norm_scope", to_string(qk_norm_scope)},
            {"lp_p", fmt::format("{}", lp_p)},
            {"qk_scale_init", qk_scale_init},
            {"qk_scale_per_head", qk_scale_per_head ? "true" : "false"},
            {"attn_softcap", fmt::format("{}", attn_softcap)},
            {"qkv_norm", qkv_norm ? "true" : "false"},
            {"logit_softcap", fmt::format("{}", logit_softcap)},
            {"z_loss", fmt::format("{}", z_loss)},
            {"attention", fused_attention ? "fused" : "naive"},
            {"precision", to_string(precision)},
            {"fp8_attention", fp8_attention ? "true" : "false"},
            {"pos_emb", to_string(pos_emb)},
            {"rope_theta", fmt::format("{}", rope_theta)},
            {"qk_norm_order", to_string(qk_norm_order)},
            {"mlp", to_string(mlp)},
            {"mlp_hidden", std::to_string(mlp_hidden)}};
}

GPTConfig with_runtime_of(GPTConfig architecture, const GPTConfig& runtime) {
    architecture.fused_attention = runtime.fused_attention;
    architecture.precision = runtime.precision;
    architecture.fp8_attention = runtime.fp8_attention;
    architecture.dropout = runtime.dropout;
    architecture.z_loss = runtime.z_loss;
    return architecture;
}

std::string first_difference(const GPTConfig& a, const GPTConfig& b) {
    const std::map<std::string, std::string> sa = a.to_strings(), sb = b.to_strings();
    for (const auto& [key, value] : sa)
        if (sb.at(key) != value) return fmt::format("{}: {} vs {}", key, value, sb.at(key));
    return "";
}

GPTConfig GPTConfig::from_strings(const std::map<std::string, std::string>& fields) {
    GPTConfig c;
    auto get = [&](const char* key) -> const std::string& {
        auto it = fields.find(key);
        QK_CHECK(it != fields.end(), "config: field '{}' is missing", key);
        return it->second;
    };
    auto has = [&](const char* key) { return fields.count(key) > 0; };
    auto integer = [&](const char* key) { return parse_integer(get(key), key); };
    auto number = [&](const char* key) { return parse_number(get(key), key); };
    auto boolean = [&](const char* key) {
        const std::string& v = get(key);
        QK_CHECK(v == "true" || v == "false", "config: {} must be true or false, got '{}'", key, v);
        return v == "true";
    };
    c.vocab_size = integer("vocab_size");
    c.block_size = integer("block_size");
    c.n_layer = integer("n_layer");
    c.n_head = integer("n_head");
    c.n_embd = integer("n_embd");
    c.bias = boolean("bias");
    c.tie_embeddings = boolean("tie_embeddings");
    c.norm = parse_norm_kind(get("norm"));
    c.dropout = number("dropout");
    c.qk_norm = parse_qk_norm(get("qk_norm"));
    c.qk_norm_scope = parse_norm_scope(get("qk_norm_scope"));
    c.lp_p = number("lp_p");
    c.qk_scale_init = get("qk_scale_init");
    c.qk_scale_per_head = boolean("qk_scale_per_head");
    c.attn_softcap = number("attn_softcap");
    c.qkv_norm = boolean("qkv_norm");
    c.logit_softcap = number("logit_softcap");
    c.z_loss = number("z_loss");
    // The fields below are absent from checkpoints written before them, and default to what
    // those checkpoints meant.
    // Before the fused kernel, attention was computed naively, but the weights do not depend on
    // it, so they load with today's default.
    if (has("attention")) {
        const std::string& v = get("attention");
        QK_CHECK(v == "fused" || v == "naive", "config: attention must be fused or naive, got '{}'",
                 v);
        c.fused_attention = v == "fused";
    }
    // Before mixed precision all was float32; the weights are float32 either way, so a
    // checkpoint loads under either precision.
    if (has("precision")) c.precision = parse_precision(get("precision"));
    if (has("fp8_attention")) c.fp8_attention = boolean("fp8_attention");
    // Before RoPE: learned positions.
    if (has("pos_emb")) c.pos_emb = parse_pos_emb(get("pos_emb"));
    if (has("rope_theta")) c.rope_theta = number("rope_theta");
    if (has("qk_norm_order")) c.qk_norm_order = parse_qk_norm_order(get("qk_norm_order"));
    // Before gated MLPs: GPT-2's, 4 · n_embd wide.
    if (has("mlp")) c.mlp = parse_mlp_kind(get("mlp"));
    if (has("mlp_hidden")) c.mlp_hidden = integer("mlp_hidden");
    // Before the Qwen3 / OLMo 2 / Gemma 3 switches: GPT-2's block (every head its own k and v,
    // D = C / H, pre-norm, ε 1e-5, no offsets or windows).
    if (has("n_kv_head")) c.n_kv_head = integer("n_kv_head");
    if (has("head_size")) c.head_size = integer("head_size");
    if (has("sliding_window")) c.sliding_window = integer("sliding_window");
    if (has("norm_eps")) c.norm_eps = number("norm_eps");
    if (has("embedding_scale")) c.embedding_scale = number("embedding_scale");
    if (has("rope_local_theta")) c.rope_local_theta = number("rope_local_theta");
    if (has("query_pre_attn_scalar")) c.query_pre_attn_scalar = number("query_pre_attn_scalar");
    if (has("norm_placement")) c.norm_placement = parse_norm_placement(get("norm_placement"));
    if (has("norm_unit_offset")) c.norm_unit_offset = boolean("norm_unit_offset");
    if (has("layer_types")) c.layer_types = get("layer_types");
    c.validate();
    return c;
}

double min_parameter_values(const GPTConfig& config) {
    const double C = static_cast<double>(config.n_embd);
    const double q_width = static_cast<double>(config.n_head) * config.head_dim();
    const double kv_width = static_cast<double>(config.kv_heads()) * config.head_dim();
    const double hidden = static_cast<double>(config.mlp_width());
    const double mlp_matrices = config.mlp == MLPKind::gelu ? 2 : 3;
    const double positions =
        config.pos_emb == PosEmb::learned ? static_cast<double>(config.block_size) : 0.0;
    const double attention = (2 * q_width + 2 * kv_width) * C;
    return static_cast<double>(config.n_layer) * (attention + mlp_matrices * C * hidden) +
           (static_cast<double>(config.vocab_size) + positions) * C;
}

}  // namespace qk::nn
