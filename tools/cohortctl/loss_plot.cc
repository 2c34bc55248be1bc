#include "tools/cohortctl/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cohort::cohortctl {
namespace {

constexpr double kLeft = 70, kRight = 20, kTop = 40, kBottom = 50;
constexpr char kTrainingColor[] = "#1f77b4";
constexpr char kValidationColor[] = "#d62728";

std::string Escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default:
        // Control characters are not allowed in XML 1.0 text.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out.push_back(c);
    }
  }
  return out;
}

std::string TickLabel(double value) { return absl::StrFormat("%g", value); }

struct Frame {
  double x0, y0, w, h;               // the plot area in pixels
  double step_min, step_max;         // data range shown
  double loss_min, loss_max;
  double X(double step) const { return x0 + (step - step_min) / (step_max - step_min) * w; }
  double Y(double loss) const { return y0 + h - (loss - loss_min) / (loss_max - loss_min) * h; }
};

void Series(const google::protobuf::RepeatedPtrField<v1::LossPoint>& points, const Frame& f,
            const char* name, const char* color, bool dots, std::string* svg) {
  if (points.empty()) return;
  std::string coordinates;
  for (const v1::LossPoint& p : points) {
    if (!std::isfinite(p.loss())) continue;
    absl::StrAppendFormat(&coordinates, "%s%.2f,%.2f", coordinates.empty() ? "" : " ",
                          f.X(static_cast<double>(p.step())), f.Y(p.loss()));
  }
  absl::StrAppendFormat(svg,
                        "<polyline class=\"series\" data-series=\"%s\" fill=\"none\" stroke=\"%s\" "
                        "stroke-width=\"1.5\" points=\"%s\"/>\n",
                        name, color, coordinates);
  if (!dots) return;
  for (const v1::LossPoint& p : points) {
    if (!std::isfinite(p.loss())) continue;
    absl::StrAppendFormat(svg, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3\" fill=\"%s\"><title>step %d: "
                               "%.4f</title></circle>\n",
                          f.X(static_cast<double>(p.step())), f.Y(p.loss()), color, p.step(),
                          p.loss());
  }
}

}  // namespace

std::vector<double> NiceTicks(double lo, double hi, int count) {
  const double raw = (hi - lo) / std::max(1, count);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::string RenderLossPlotSvg(const v1::LossHistory& history, const LossPlotOptions& options) {
  double step_min = std::numeric_limits<double>::infinity(), step_max = -step_min;
  double loss_min = step_min, loss_max = -step_min;
  for (const auto* series : {&history.training(), &history.validation()}) {
    for (const v1::LossPoint& p : *series) {
      if (!std::isfinite(p.loss())) continue;
      step_min = std::min(step_min, static_cast<double>(p.step()));
      step_max = std::max(step_max, static_cast<double>(p.step()));
      loss_min = std::min(loss_min, p.loss());
      loss_max = std::max(loss_max, p.loss());
    }
  }
  const bool empty = !std::isfinite(step_min);
  if (empty) {
    step_min = 0, step_max = 1, loss_min = 0, loss_max = 1;
  }
  // Steps from 0 (where a run starts) unless the curve begins far later; a
  // loss margin so the extremes do not sit on the frame.
  if (step_min > 0 && step_min <= (step_max - step_min)) step_min = 0;
  if (step_max <= step_min) step_max = step_min + 1;
  const double margin = loss_max > loss_min ? 0.05 * (loss_max - loss_min)
                                            : std::max(0.05 * std::abs(loss_max), 0.01);
  loss_min -= margin;
  loss_max += margin;

  const Frame f{kLeft,
                kTop,
                std::max(10.0, options.width - kLeft - kRight),
                std::max(10.0, options.height - kTop - kBottom),
                step_min,
                step_max,
                loss_min,
                loss_max};
  std::string svg = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.1f\" y=\"24\" font-size=\"15\">%s</text>\n",
      options.width, options.height, options.width, options.height, kLeft,
      Escape(options.title.empty() ? "loss" : options.title));
  absl::StrAppendFormat(&svg,
                        "<rect id=\"plot-area\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
                        "height=\"%.2f\" fill=\"none\" stroke=\"#444\" data-step-min=\"%.17g\" "
                        "data-step-max=\"%.17g\" data-loss-min=\"%.17g\" data-loss-max=\"%.17g\"/>\n",
                        f.x0, f.y0, f.w, f.h, f.step_min, f.step_max, f.loss_min, f.loss_max);
  for (const double t : NiceTicks(f.step_min, f.step_max, 8)) {
    const double x = f.X(t);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%s</text>\n",
                          x, f.y0, x, f.y0 + f.h, x, f.y0 + f.h + 16, TickLabel(t));
  }
  for (const double t : NiceTicks(f.loss_min, f.loss_max, 6)) {
    const double y = f.Y(t);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">%s</text>\n",
                          f.x0, y, f.x0 + f.w, y, f.x0 - 6, y + 4, TickLabel(t));
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">step</text>\n"
                        "<text x=\"16\" y=\"%.2f\" text-anchor=\"middle\" "
                        "transform=\"rotate(-90 16 %.2f)\">loss</text>\n",
                        f.x0 + f.w / 2, f.y0 + f.h + 38, f.y0 + f.h / 2, f.y0 + f.h / 2);
  Series(history.training(), f, "training", kTrainingColor, /*dots=*/false, &svg);
  Series(history.validation(), f, "validation", kValidationColor, /*dots=*/true, &svg);
  // Legend, top right inside the plot area.
  const double lx = f.x0 + f.w - 150, ly = f.y0 + 14;
  absl::StrAppendFormat(&svg,
                        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
                        "stroke-width=\"2\"/><text x=\"%.2f\" y=\"%.2f\">training (%d points)</text>\n"
                        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\" "
                        "stroke-width=\"2\"/><text x=\"%.2f\" y=\"%.2f\">validation (%d)</text>\n",
                        lx, ly, lx + 20, ly, kTrainingColor, lx + 26, ly + 4,
                        history.training_size(), lx, ly + 18, lx + 20, ly + 18, kValidationColor,
                        lx + 26, ly + 22, history.validation_size());
  if (empty) {
    absl::StrAppendFormat(&svg,
                          "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">no loss reported "
                          "yet</text>\n",
                          f.x0 + f.w / 2, f.y0 + f.h / 2);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace cohort::cohortctl
