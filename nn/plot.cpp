#include "nn/plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace qk::plot {

namespace {

constexpr double kPanelW = 520, kPanelH = 330;
constexpr double kLeft = 70, kRight = 150, kTop = 34, kBottom = 46;  // margins inside a panel
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

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

struct Axis {
    double lo = 0, hi = 1;
    bool log = false;
    double map(double v, double from, double to) const {  // value -> pixel
        double a = log ? std::log10(v) : v, l = log ? std::log10(lo) : lo,
               h = log ? std::log10(hi) : hi;
        return from + (a - l) / (h - l) * (to - from);
    }
    // At most a dozen ticks: every loop below is bounded by a count, so that no range (a NaN,
    // an empty log axis, 1e300 wide) can make it run away.
    std::vector<double> ticks() const {
        std::vector<double> out;
        if (!std::isfinite(lo) || !std::isfinite(hi) || !(hi > lo) || (log && !(lo > 0)))
            return out;
        if (log) {
            const double first = std::floor(std::log10(lo)), last = std::ceil(std::log10(hi));
            for (double p = first; p <= last && out.size() < 400; ++p) {
                double v = std::pow(10.0, p);
                if (v >= lo * 0.999 && v <= hi * 1.001) out.push_back(v);
            }
            if (out.size() >= 2) return out;
            out.clear();  // less than a decade: fall through to linear ticks
        }
        double step = std::pow(10.0, std::floor(std::log10((hi - lo) / 5)));
        if ((hi - lo) / step > 10) step *= 2;
        if ((hi - lo) / step > 10) step *= 2.5;
        if (!(step > 0) || !std::isfinite(step)) return out;
        const double first = std::ceil(lo / step);
        for (int i = 0; i <= 12 && (first + i) * step <= hi + step * 1e-9; ++i)
            out.push_back((first + i) * step);
        return out;
    }
};

bool usable(double v, bool log) { return std::isfinite(v) && (!log || v > 0); }

Axis fit_axis(const std::vector<Series>& series, bool use_x, bool log) {
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const auto& s : series)
        for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
            if (!usable(s.y[i], log && !use_x) || !usable(s.x[i], log && use_x)) continue;
            double v = use_x ? s.x[i] : s.y[i];
            lo = std::min(lo, v);
            hi = std::max(hi, v);
        }
    Axis a;
    a.log = log;
    if (!std::isfinite(lo)) {  // nothing to draw: an empty panel with a valid axis
        if (log) a.lo = 1, a.hi = 10;
        return a;
    }
    if (hi == lo) {
        hi = log ? hi * 2 : hi + 1;
        lo = log ? lo / 2 : lo - 1;
    }
    if (!log) {  // a little air above and below
        double pad = (hi - lo) * 0.05;
        lo -= use_x ? 0 : pad;
        hi += use_x ? 0 : pad;
    }
    a.lo = lo;
    a.hi = hi;
    return a;
}

std::string render_panel(const Panel& p, double ox, double oy) {
    std::string out;
    const double x0 = ox + kLeft, x1 = ox + kPanelW - kRight, y0 = oy + kPanelH - kBottom,
                 y1 = oy + kTop;
    Axis ax = fit_axis(p.series, true, p.log_x), ay = fit_axis(p.series, false, p.log_y);
    out += fmt::format(R"(<text x="{}" y="{}" font-size="14" font-weight="bold">{}</text>)"
                       "\n",
                       x0, oy + 20, escape(p.title));
    out += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#444"/>)"
                       "\n",
                       x0, y1, x1 - x0, y0 - y1);
    for (double t : ax.ticks()) {
        double px = ax.map(t, x0, x1);
        out += fmt::format(
            R"(<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="#ddd"/><text x="{0}" y="{3}" font-size="10" text-anchor="middle">{4:.4g}</text>)"
            "\n",
            px, y1, y0, y0 + 14, t);
    }
    for (double t : ay.ticks()) {
        double py = ay.map(t, y0, y1);
        out += fmt::format(
            R"(<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="#ddd"/><text x="{3}" y="{4}" font-size="10" text-anchor="end">{5:.4g}</text>)"
            "\n",
            x0, py, x1, x0 - 4, py + 3, t);
    }
    out += fmt::format(R"(<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>)"
                       "\n",
                       (x0 + x1) / 2, y0 + 32, escape(p.x_label));
    out += fmt::format(
        R"svg(<text x="{0}" y="{1}" font-size="11" text-anchor="middle" transform="rotate(-90 {0} {1})">{2}</text>)svg"
        "\n",
        ox + 16, (y0 + y1) / 2, escape(p.y_label));
    for (size_t k = 0; k < p.series.size(); ++k) {
        const Series& s = p.series[k];
        const char* color = kColors[k % std::size(kColors)];
        std::string points;
        for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
            if (usable(s.x[i], p.log_x) && usable(s.y[i], p.log_y))
                points +=
                    fmt::format("{:.1f},{:.1f} ", ax.map(s.x[i], x0, x1), ay.map(s.y[i], y0, y1));
        out += fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>)"
                           "\n",
                           color, points);
        out += fmt::format(
            R"(<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="{3}" stroke-width="2"/><text x="{4}" y="{5}" font-size="11">{6}</text>)"
            "\n",
            x1 + 8, y1 + 10 + 16 * k, x1 + 24, color, x1 + 28, y1 + 14 + 16 * k, escape(s.label));
    }
    return out;
}

}  // namespace

std::string render_svg(const std::vector<Panel>& panels, int columns) {
    columns = std::max(1, std::min<int>(columns, static_cast<int>(panels.size())));
    const int rows = (static_cast<int>(panels.size()) + columns - 1) / columns;
    std::string out = fmt::format(
        R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif">)"
        "\n"
        R"(<rect width="100%" height="100%" fill="white"/>)"
        "\n",
        kPanelW * columns, kPanelH * rows);
    for (size_t i = 0; i < panels.size(); ++i)
        out += render_panel(panels[i], kPanelW * (i % columns), kPanelH * (i / columns));
    return out + "</svg>\n";
}

}  // namespace qk::plot
