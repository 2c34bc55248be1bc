#include "tools/cohortctl/text_table.h"

#include <algorithm>
#include <utility>

namespace cohort::cohortctl {
namespace {

constexpr size_t kGap = 2;

// Display width of UTF-8 text: one column per code point (no wide glyphs in
// what cohortctl prints).
size_t DisplayWidth(const std::string& text) {
  size_t width = 0;
  for (const char c : text) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++width;
  }
  return width;
}

std::string OneLine(std::string cell) {
  for (char& c : cell) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  return cell;
}

}  // namespace

TextTable::TextTable(std::vector<std::string> headers) : headers_(std::move(headers)) {}

void TextTable::AddRow(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  for (std::string& cell : cells) cell = OneLine(std::move(cell));
  rows_.push_back(std::move(cells));
}

std::string TextTable::Render() const {
  std::vector<size_t> widths(headers_.size(), 0);
  auto measure = [&widths](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], DisplayWidth(row[i]));
    }
  };
  measure(headers_);
  for (const auto& row : rows_) measure(row);

  std::string out;
  auto append_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) {
        line.append(widths[i] - DisplayWidth(row[i]) + kGap, ' ');
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  };
  append_row(headers_);
  for (const auto& row : rows_) append_row(row);
  return out;
}

}  // namespace cohort::cohortctl
