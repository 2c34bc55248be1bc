#pragma once
// A plain-text table with left-aligned columns, for cohortctl's listings.
// Not thread-safe; build one per table.

#include <string>
#include <vector>

namespace cohort::cohortctl {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> headers);

  // Adds a row; missing cells print empty, extra cells are dropped. Line
  // breaks and tabs in a cell become spaces so a row stays one line.
  void AddRow(std::vector<std::string> cells);

  size_t row_count() const { return rows_.size(); }

  // Header line and rows, columns separated by at least two spaces, no
  // trailing blanks; every line ends with '\n'.
  std::string Render() const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace cohort::cohortctl
