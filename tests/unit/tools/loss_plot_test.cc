// cohortctl plot's SVG: parsed back (the plot area's data ranges map each
// polyline vertex to a step and a loss), every point of the history is
// where it belongs, and the document is well formed enough for a browser
// (one root, escaped title).

#include "tools/cohortctl/loss_plot.h"

#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace cohort::cohortctl {
namespace {

std::string Attribute(const std::string& element, const std::string& name) {
  const std::regex pattern(" " + name + "=\"([^\"]*)\"");
  std::smatch match;
  if (!std::regex_search(element, match, pattern)) return "";
  return match[1];
}

double Number(const std::string& text) {
  double value = 0;
  EXPECT_TRUE(absl::SimpleAtod(text, &value)) << text;
  return value;
}

struct Plotted {
  int64_t step;
  double loss;
};

// The points of `series` in `svg`, mapped back through the plot area.
std::vector<Plotted> ReadSeries(const std::string& svg, const std::string& series) {
  std::smatch match;
  EXPECT_TRUE(std::regex_search(svg, match, std::regex("<rect id=\"plot-area\"[^>]*>")));
  const std::string area = match[0];
  const double x = Number(Attribute(area, "x")), y = Number(Attribute(area, "y"));
  const double w = Number(Attribute(area, "width")), h = Number(Attribute(area, "height"));
  const double s0 = Number(Attribute(area, "data-step-min"));
  const double s1 = Number(Attribute(area, "data-step-max"));
  const double l0 = Number(Attribute(area, "data-loss-min"));
  const double l1 = Number(Attribute(area, "data-loss-max"));
  const std::regex line("<polyline class=\"series\" data-series=\"" + series + "\"[^>]*>");
  if (!std::regex_search(svg, match, line)) return {};
  std::vector<Plotted> points;
  for (absl::string_view pair : absl::StrSplit(Attribute(match[0], "points"), ' ')) {
    const std::vector<std::string> xy = absl::StrSplit(pair, ',');
    EXPECT_EQ(xy.size(), 2u);
    const double px = Number(xy[0]), py = Number(xy[1]);
    EXPECT_GE(px, x - 0.01);
    EXPECT_LE(px, x + w + 0.01);
    EXPECT_GE(py, y - 0.01);
    EXPECT_LE(py, y + h + 0.01);
    points.push_back({std::llround(s0 + (px - x) / w * (s1 - s0)),
                      l0 + (y + h - py) / h * (l1 - l0)});
  }
  return points;
}

v1::LossHistory SampleHistory() {
  v1::LossHistory history;
  for (int s = 1; s <= 400; s += 3) {
    v1::LossPoint* p = history.add_training();
    p->set_step(s);
    p->set_loss(4.0 * std::exp(-s / 150.0) + 1.5 + 0.05 * std::sin(s));
  }
  for (int s = 50; s <= 400; s += 50) {
    v1::LossPoint* p = history.add_validation();
    p->set_step(s);
    p->set_loss(4.0 * std::exp(-s / 150.0) + 1.7);
  }
  return history;
}

TEST(LossPlotTest, EveryPointIsPlottedWhereItBelongs) {
  const v1::LossHistory history = SampleHistory();
  const std::string svg = RenderLossPlotSvg(history, {.title = "job j-1 (demo)"});
  for (const auto& [name, series] :
       {std::pair{"training", &history.training()}, std::pair{"validation", &history.validation()}}) {
    const std::vector<Plotted> plotted = ReadSeries(svg, name);
    ASSERT_EQ(plotted.size(), static_cast<size_t>(series->size())) << name;
    // Pixels are written with 2 decimals: a loss range of ~4 over ~410 pixels
    // reads back within 1e-4.
    for (int i = 0; i < series->size(); ++i) {
      EXPECT_EQ(plotted[i].step, series->Get(i).step()) << name << " " << i;
      EXPECT_NEAR(plotted[i].loss, series->Get(i).loss(), 1e-4) << name << " " << i;
    }
  }
  // One dot per validation result.
  const std::regex circle("<circle");
  EXPECT_EQ(std::distance(std::sregex_iterator(svg.begin(), svg.end(), circle),
                          std::sregex_iterator()),
            history.validation_size());
}

TEST(LossPlotTest, TheDocumentIsOneSvgWithAnEscapedTitle) {
  const std::string svg = RenderLossPlotSvg(SampleHistory(), {.title = "a<b & \"c\""});
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_NE(svg.find("a&lt;b &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
}

TEST(LossPlotTest, AnEmptyHistoryDrawsAxesAndSaysSo) {
  const std::string svg = RenderLossPlotSvg(v1::LossHistory(), {});
  EXPECT_NE(svg.find("no loss reported yet"), std::string::npos);
  EXPECT_TRUE(ReadSeries(svg, "training").empty());
}

TEST(LossPlotTest, TicksAreRoundNumbersCoveringTheRange) {
  EXPECT_EQ(NiceTicks(0, 400, 8), (std::vector<double>{0, 50, 100, 150, 200, 250, 300, 350, 400}));
  const std::vector<double> ticks = NiceTicks(1.3, 2.1, 4);
  ASSERT_GE(ticks.size(), 3u);
  EXPECT_GE(ticks.front(), 1.3);
  EXPECT_LE(ticks.back(), 2.1 + 1e-9);
  EXPECT_NEAR(ticks[1] - ticks[0], 0.2, 1e-12);
}

}  // namespace
}  // namespace cohort::cohortctl
