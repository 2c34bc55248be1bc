#pragma once
// A test's scratch files: text handed to a tool, and arrays of numbers
// exchanged with the PyTorch references (tests/reference/*.py), which read
// and write them raw (native byte order, no header). Header-only. A failure
// is a gtest failure naming the file.

#include <cstddef>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"

namespace cohort::testing {

// Writes `contents` to `path`, replacing the file.
inline void WriteFile(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  EXPECT_TRUE(out.good()) << path;
}

// Writes `values` to `path` as their bytes.
template <typename T>
void WriteBinaryFile(const std::string& path, const std::vector<T>& values) {
  WriteFile(path, std::string_view(reinterpret_cast<const char*>(values.data()),
                                   values.size() * sizeof(T)));
}

// The `count` values `path` holds; a failure when it holds fewer or more.
template <typename T>
std::vector<T> ReadBinaryFile(const std::string& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  std::vector<T> values(count);
  in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * sizeof(T)));
  EXPECT_TRUE(in.good()) << path;
  EXPECT_EQ(in.peek(), EOF) << path << " is longer than " << count << " elements";
  return values;
}

}  // namespace cohort::testing
