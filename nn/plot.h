// A small SVG line-chart writer for training curves: no dependency, opens in any browser.
#pragma once

#include <string>
#include <vector>

namespace qk::plot {

struct Series {
    std::string label;
    std::vector<double> x, y;  // points with a non-finite y (or y <= 0 on a log axis) are skipped
};

struct Panel {
    std::string title, x_label, y_label;
    bool log_x = false, log_y = false;
    std::vector<Series> series;
};

// Panels laid out in a grid of `columns`, each with axes, ticks and a legend.
std::string render_svg(const std::vector<Panel>& panels, int columns = 2);

}  // namespace qk::plot
