#include "nn/signals/plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace qk::plot {

namespace {

constexpr double kPanelW = 520, kPanelH = 330;
constexpr double kLeft = 70, kRight = 150, kTop = 34, kBottom = 46;  // margins inside a panel
constexpr double kTitleLine = 20;  // height of a line of the figure's title
// Ticks that fit a panel's axes: labels 10 px high on the y axis, up to 6 characters wide on a
// log x axis (0.0005), where a linear one has round numbers (9000).
constexpr int kMaxTicksY = 11, kMaxTicksX = 11, kMaxTicksLogX = 8;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
// Past ten series the colours come round again with a dash pattern, so that a sweep of 25
// variants still has 25 distinguishable lines: solid, dashed, dotted, dash-dot.
constexpr const char* kDashes[] = {"", "7 3", "2 2", "7 2 2 2"};
// A legend entry: a 16 px line sample, then the label at font size 11, whose characters are
// about 6.6 px wide on average in a sans-serif font (an estimate: SVG cannot measure text).
constexpr double kLegendRow = 16, kLegendSample = 28, kLegendCharW = 6.6, kTitleCharW = 8.4;
constexpr double kLegendMaxW = 480;  // longer labels run past the figure rather than widen it

struct Style {
    const char* color;
    std::string dash_attribute;  // ` stroke-dasharray="…"`, or empty for a solid line
};

Style style_of(size_t k) {
    const char* dash = kDashes[(k / std::size(kColors)) % std::size(kDashes)];
    return {kColors[k % std::size(kColors)],
            *dash ? fmt::format(R"( stroke-dasharray="{}")", dash) : std::string()};
}

// Characters (UTF-8 code points) in s: what its width on the page goes by.
size_t text_length(const std::string& s) {
    return static_cast<size_t>(
        std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// The size of one cell of the figure's grid: the plot box keeps its size, and the margin right
// of it and the cell's height grow to hold the longest legend label, every legend row and the
// title, so that a sweep of many variants does not draw its legend off the page.
struct CellSize {
    double width = kPanelW, height = kPanelH;
};

CellSize cell_size(const std::vector<Panel>& panels) {
    CellSize cell;
    for (const Panel& p : panels) {
        size_t longest = 0;
        for (const Series& s : p.series) longest = std::max(longest, text_length(s.label));
        const double legend_w =
            std::min(kLegendSample + kLegendCharW * static_cast<double>(longest) + 12, kLegendMaxW);
        const double title_w = kTitleCharW * static_cast<double>(text_length(p.title));
        cell.width = std::max({cell.width, kPanelW - kRight + legend_w, kLeft + title_w + 12});
        cell.height = std::max(cell.height,
                               kTop + 10 + kLegendRow * static_cast<double>(p.series.size()) + 6);
    }
    return cell;
}

std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '<')
            out += "&lt;";
        else if (c == '>')
            out += "&gt;";
        else if (c == '&')
            out += "&amp;";
        else
            out += c;
    }
    return out;
}

// Round ticks every 1, 2 or 5 x 10^k, the smallest step that gives at most max_ticks of them,
// inside [lo, hi] or (widen) from the last tick at or below lo to the first at or above hi.
// Every loop is bounded by a count, so that no range (1e300 wide, say) can make it run away.
AxisTicks linear_ticks(double lo, double hi, int max_ticks, bool widen) {
    AxisTicks a{lo, hi, {}};
    const double base = std::pow(10.0, std::floor(std::log10((hi - lo) / 5)));
    double step = 0;
    for (double m : {1.0, 2.0, 5.0, 10.0, 20.0, 50.0}) {
        step = base * m;
        if ((hi - lo) / step <= max_ticks - 1 - (widen ? 2 : 0)) break;
    }
    if (!(step > 0) || !std::isfinite(step)) return a;
    double first = std::ceil(lo / step), last = std::floor(hi / step + 1e-9);
    if (widen) {
        first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
        a.lo = first * step, a.hi = last * step;
    }
    for (int i = 0; i <= max_ticks && first + i <= last + 1e-9; ++i)
        a.ticks.push_back((first + i) * step);
    return a;
}

// Mantissas of a log axis's ticks in each decade, densest first.
const std::vector<std::vector<double>> kMantissas{{1, 1.5, 2, 3, 4, 5, 7}, {1, 2, 5}, {1, 3}, {1}};

// Ticks at mantissas × 10^d (d a multiple of `stride`), widened to one at or below lo and one
// at or above hi; none if that takes more than max_ticks.
AxisTicks decade_ticks(double lo, double hi, const std::vector<double>& mantissas, int stride,
                       int max_ticks) {
    AxisTicks a{lo, hi, {}};
    const double eps = 1e-9;
    // Decades d with 10^d in range of a double, from the one below lo to the one above hi.
    const int d_lo = std::max(static_cast<int>(std::floor(std::log10(lo))) - 1, -300),
              d_hi = std::min(static_cast<int>(std::ceil(std::log10(hi))) + 1, 300);
    const int first = static_cast<int>(std::floor(static_cast<double>(d_lo) / stride)) * stride;
    if (static_cast<double>(d_hi - first) / stride * static_cast<double>(mantissas.size()) >
        max_ticks + 4.0 * static_cast<double>(mantissas.size()))
        return a;  // too many even before widening
    std::vector<double> all;
    for (int d = first; d <= d_hi; d += stride)
        for (double m : mantissas)
            if (const double v = m * std::pow(10.0, d); v > 0 && std::isfinite(v)) all.push_back(v);
    if (all.empty()) return a;
    // The last candidate at or below lo and the first at or above hi bound the axis (past the
    // range of a double, the data's own ends do).
    size_t i_lo = 0, i_hi = all.size() - 1;
    for (size_t i = 0; i < all.size(); ++i)
        if (all[i] <= lo * (1 + eps)) i_lo = i;
    for (size_t i = all.size(); i-- > 0;)
        if (all[i] >= hi * (1 - eps)) i_hi = i;
    if (i_hi < i_lo || i_hi - i_lo + 1 > static_cast<size_t>(max_ticks)) return a;
    a.ticks.assign(all.begin() + static_cast<long>(i_lo),
                   all.begin() + static_cast<long>(i_hi) + 1);
    a.lo = std::min(lo, a.ticks.front()), a.hi = std::max(hi, a.ticks.back());
    return a;
}

// The smallest distance between neighbouring ticks, in decades.
double smallest_log_gap(const std::vector<double>& ticks) {
    double gap = std::numeric_limits<double>::infinity();
    for (size_t i = 1; i < ticks.size(); ++i)
        gap = std::min(gap, std::log10(ticks[i] / ticks[i - 1]));
    return gap;
}

AxisTicks log_ticks(double lo, double hi, int max_ticks) {
    for (const std::vector<double>& mantissas : kMantissas) {
        AxisTicks a = decade_ticks(lo, hi, mantissas, 1, max_ticks);
        if (a.ticks.empty()) continue;
        const double data_span = std::log10(hi / lo), axis_span = std::log10(a.hi / a.lo);
        // A short range (losses from 1.45 to 1.9) would sit in a corner of 1 .. 2.
        if (data_span < 1 && axis_span > 2 * data_span) break;
        // Mantissa ticks are uneven (4 and 5 are a tenth of a decade apart): max_ticks evenly
        // spaced labels fit the axis, so no two may be much closer than that spacing, or their
        // labels overlap (0.004 0.005 on an LR axis from 0.003 to 0.03).
        if (smallest_log_gap(a.ticks) < 0.75 * axis_span / (max_ticks - 1)) continue;
        return a;
    }
    if (std::log10(hi / lo) < 1) {
        AxisTicks a = linear_ticks(lo, hi, max_ticks, true);
        if (a.lo > 0) return a;
    }
    // Beyond max_ticks decades: one tick every `stride` of them.
    const double decades = std::ceil(std::log10(hi)) - std::floor(std::log10(lo));
    const int stride = static_cast<int>(std::ceil(decades / std::max(max_ticks - 2, 1)));
    for (int s = std::max(stride, 1); s <= 1000; s *= 2) {
        AxisTicks a = decade_ticks(lo, hi, {1}, s, max_ticks);
        if (!a.ticks.empty()) return a;
    }
    return {lo, hi, {}};
}

}  // namespace

AxisTicks axis_ticks(double lo, double hi, bool log, int max_ticks) {
    if (!std::isfinite(lo) || !std::isfinite(hi) || !(hi > lo) || (log && !(lo > 0)) ||
        max_ticks < 2)
        return {lo, hi, {}};
    return log ? log_ticks(lo, hi, max_ticks) : linear_ticks(lo, hi, max_ticks, false);
}

namespace {

struct Axis {
    double lo = 0, hi = 1;
    bool log = false;
    std::vector<double> ticks;
    double map(double v, double from, double to) const {  // value -> pixel
        double a = log ? std::log10(v) : v, l = log ? std::log10(lo) : lo,
               h = log ? std::log10(hi) : hi;
        return from + (a - l) / (h - l) * (to - from);
    }
};

bool usable(double v, bool log) { return std::isfinite(v) && (!log || v > 0); }

// from_x: only points at x >= from_x count for a y axis (all of them, if that leaves none).
Axis fit_axis(const std::vector<Series>& series, bool use_x, bool log, int max_ticks,
              double from_x = -1e308) {
    bool any_from = false;
    for (const auto& s : series)
        for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
            any_from = any_from || (s.x[i] >= from_x && std::isfinite(s.y[i]));
    if (!any_from) from_x = -1e308;
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const auto& s : series)
        for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
            if (!usable(s.y[i], log && !use_x) || !usable(s.x[i], log && use_x)) continue;
            if (!use_x && s.x[i] < from_x) continue;
            double v = use_x ? s.x[i] : s.y[i];
            lo = std::min(lo, v);
            hi = std::max(hi, v);
        }
    if (!std::isfinite(lo)) {  // nothing to draw: an empty panel with a valid axis
        lo = log ? 1 : 0;
        hi = log ? 10 : 1;
    } else if (hi == lo) {
        hi = log ? hi * 2 : hi + 1;
        lo = log ? lo / 2 : lo - 1;
    } else if (!log && !use_x) {  // a little air above and below
        const double pad = (hi - lo) * 0.05;
        lo -= pad;
        hi += pad;
    }
    const AxisTicks t = axis_ticks(lo, hi, log, max_ticks);
    return {t.lo, t.hi, log, t.ticks};
}

std::string axis_label(const std::string& label, bool log) {
    return log ? label + " (log scale)" : label;
}

// The plot box stays kPanelW - kLeft - kRight wide and kPanelH - kTop - kBottom high, at the
// top left of its cell; the legend takes the cell's right margin.
std::string render_panel(const Panel& p, double ox, double oy) {
    std::string out;
    const double x0 = ox + kLeft, x1 = ox + kPanelW - kRight, y0 = oy + kPanelH - kBottom,
                 y1 = oy + kTop;
    const Axis ax = fit_axis(p.series, true, p.log_x, p.log_x ? kMaxTicksLogX : kMaxTicksX),
               ay = fit_axis(p.series, false, p.log_y, kMaxTicksY, p.y_range_from_x);
    out += fmt::format(R"(<text x="{}" y="{}" font-size="14" font-weight="bold">{}</text>)"
                       "\n",
                       x0, oy + 20, escape(p.title));
    out += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#444"/>)"
                       "\n",
                       x0, y1, x1 - x0, y0 - y1);
    for (double t : ax.ticks) {
        double px = ax.map(t, x0, x1);
        out += fmt::format(
            R"(<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="#ddd"/><text x="{0}" y="{3}" font-size="10" text-anchor="middle">{4:.4g}</text>)"
            "\n",
            px, y1, y0, y0 + 14, t);
    }
    for (double t : ay.ticks) {
        double py = ay.map(t, y0, y1);
        out += fmt::format(
            R"(<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="#ddd"/><text x="{3}" y="{4}" font-size="10" text-anchor="end">{5:.4g}</text>)"
            "\n",
            x0, py, x1, x0 - 4, py + 3, t);
    }
    out += fmt::format(R"(<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>)"
                       "\n",
                       (x0 + x1) / 2, y0 + 32, escape(axis_label(p.x_label, p.log_x)));
    out += fmt::format(
        R"svg(<text x="{0}" y="{1}" font-size="11" text-anchor="middle" transform="rotate(-90 {0} {1})">{2}</text>)svg"
        "\n",
        ox + 16, (y0 + y1) / 2, escape(axis_label(p.y_label, p.log_y)));
    for (size_t k = 0; k < p.series.size(); ++k) {
        const Series& s = p.series[k];
        const auto [color, dash] = style_of(k);
        std::string points, markers;
        for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
            if (!usable(s.x[i], p.log_x) || !usable(s.y[i], p.log_y)) continue;
            // Clamped to the plot's box: points outside y_range_from_x may lie beyond the axis.
            const double px = ax.map(s.x[i], x0, x1),
                         py = std::clamp(ay.map(s.y[i], y0, y1), y1, y0);
            points += fmt::format("{:.1f},{:.1f} ", px, py);
            if (s.markers)
                markers += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="{}"/>)"
                                       "\n",
                                       px, py, color);
        }
        out += fmt::format(R"(<polyline fill="none" stroke="{}"{} stroke-width="1.5" points="{}"/>)"
                           "\n",
                           color, dash, points);
        out += markers;
        const double legend_y = y1 + 10 + kLegendRow * static_cast<double>(k);
        out += fmt::format(
            R"(<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="{3}"{4} stroke-width="2"/><text x="{5}" y="{6}" font-size="11">{7}</text>)"
            "\n",
            x1 + 8, legend_y, x1 + 24, color, dash, x1 + kLegendSample, legend_y + 4,
            escape(s.label));
        if (s.markers)
            out += fmt::format(R"(<circle cx="{}" cy="{}" r="3" fill="{}"/>)"
                               "\n",
                               x1 + 16, legend_y, color);
    }
    return out;
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    for (size_t at = 0; at < text.size();) {
        const size_t end = std::min(text.find('\n', at), text.size());
        lines.push_back(text.substr(at, end - at));
        at = end + 1;
    }
    return lines;
}

}  // namespace

std::string render_svg(const std::vector<Panel>& panels, int columns, const std::string& title) {
    columns = std::max(1, std::min<int>(columns, static_cast<int>(panels.size())));
    const int rows = (static_cast<int>(panels.size()) + columns - 1) / columns;
    const std::vector<std::string> title_lines = lines_of(title);
    const double top = title_lines.empty() ? 0 : kTitleLine * (title_lines.size() + 0.5);
    const CellSize cell = cell_size(panels);
    std::string out = fmt::format(
        R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif">)"
        "\n"
        R"(<rect width="100%" height="100%" fill="white"/>)"
        "\n",
        cell.width * columns, top + cell.height * rows);
    for (size_t i = 0; i < title_lines.size(); ++i)
        out += fmt::format(R"(<text x="{}" y="{}" font-size="{}"{}>{}</text>)"
                           "\n",
                           kLeft, kTitleLine * (i + 1), i == 0 ? 15 : 12,
                           i == 0 ? R"( font-weight="bold")" : "", escape(title_lines[i]));
    for (size_t i = 0; i < panels.size(); ++i)
        out += render_panel(panels[i], cell.width * static_cast<double>(i % columns),
                            top + cell.height * static_cast<double>(i / columns));
    return out + "</svg>\n";
}

}  // namespace qk::plot
