#pragma once
// Typed identities (docs/conventions.md, Types and names): a worker id, an
// incarnation, a generation, a rank and a step are distinct types so they
// cannot be swapped silently.

#include <compare>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <utility>

namespace cohort {

// A value wrapper that only compares with its own kind.
template <typename Tag, typename T>
class TypedId {
 public:
  using ValueType = T;
  constexpr TypedId() = default;
  constexpr explicit TypedId(T value) : value_(std::move(value)) {}
  constexpr const T& value() const { return value_; }
  constexpr auto operator<=>(const TypedId&) const = default;
  friend std::ostream& operator<<(std::ostream& os, const TypedId& id) {
    return os << id.value_;
  }
  template <typename H>
  friend H AbslHashValue(H h, const TypedId& id) {
    return H::combine(std::move(h), id.value_);
  }

 private:
  T value_{};
};

using WorkerId = TypedId<struct WorkerIdTag, std::string>;
using JobId = TypedId<struct JobIdTag, std::string>;
// Random per process start; zero is never a valid incarnation.
using Incarnation = TypedId<struct IncarnationTag, uint64_t>;
// Bumped on every mesh change of a job; messages of older generations are stale.
using Generation = TypedId<struct GenerationTag, uint64_t>;
using Rank = TypedId<struct RankTag, int32_t>;
using Step = TypedId<struct StepTag, int64_t>;

}  // namespace cohort

template <typename Tag, typename T>
struct std::hash<cohort::TypedId<Tag, T>> {
  size_t operator()(const cohort::TypedId<Tag, T>& id) const {
    return std::hash<T>()(id.value());
  }
};
