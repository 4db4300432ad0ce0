// A small SVG line-chart writer for training curves: no dependency, opens in any browser.
#pragma once

#include <string>
#include <vector>

namespace qk::plot {

struct Series {
    std::string label;
    std::vector<double> x, y;  // points with a non-finite y (or y <= 0 on a log axis) are skipped
    // A dot on every point as well as the line: for sparse measurements (the validation loss,
    // every few hundred steps), whose line alone hides where the measurements are.
    bool markers = false;
};

struct Panel {
    std::string title, x_label, y_label;  // a log axis's label gets " (log scale)" appended
    bool log_x = false, log_y = false;
    std::vector<Series> series;
    // Only points at x >= this set the y axis's range; earlier ones outside it are drawn clamped
    // to its edge. A loss curve's first steps (the loss at initialisation, 4.2 nats for a
    // character model) would otherwise squash the rest of the run into a band at the bottom.
    double y_range_from_x = -1e308;
};

// The ticks of an axis whose data spans [lo, hi], and the range [lo, hi] it is drawn over.
// A linear axis keeps the data's range, with round ticks inside it. A log axis gets ticks at
// mantissas per decade, as dense as max_ticks allows: 1 1.5 2 3 4 5 7, or 1 2 5, or 1 3, or 1
// (one per decade), or one every few decades past max_ticks decades; and its range widens to
// the ticks just outside the data, so that the lowest and the highest value each have a tick
// beyond them. A log range too short for that (the widening would waste more than half the
// axis) gets round linear ticks, widened the same way.
struct AxisTicks {
    double lo = 0, hi = 1;
    std::vector<double> ticks;
};
AxisTicks axis_ticks(double lo, double hi, bool log, int max_ticks);

// Panels laid out in a grid of `columns`, each with axes, ticks and a legend, under `title`
// (lines separated by '\n'; the first in bold; none when empty).
std::string render_svg(const std::vector<Panel>& panels, int columns = 2,
                       const std::string& title = "");

}  // namespace qk::plot
