#pragma once
// UninitializedArray: a growable array whose new elements are not
// initialised, for buffers that are always written before they are read
// (the gradient accumulation, a previous state version). A std::vector
// zero-fills what it allocates, which for these buffers is a second pass
// over hundreds of megabytes: the kernel already zeroes fresh pages once,
// when they are first written.
//
// Thread-compatible.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>

namespace cohort::train {

template <typename T>
class UninitializedArray {
 public:
  UninitializedArray() = default;
  // A moved-from array is empty (its buffer went with the move).
  UninitializedArray(UninitializedArray&& other) noexcept { *this = std::move(other); }
  UninitializedArray& operator=(UninitializedArray&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    return *this;
  }

  // Makes room for `n` elements, allocating at least `min_capacity` when
  // it allocates (room for a later, larger size). Elements beyond the old
  // size are uninitialised; a larger capacity drops the old contents.
  void Resize(size_t n, size_t min_capacity = 0) {
    if (n > capacity_) {
      capacity_ = std::max(n, min_capacity);
      data_ = std::make_unique_for_overwrite<T[]>(capacity_);
    }
    size_ = n;
  }
  // Takes `other`'s buffer (and with it pages already in memory) when this
  // array will hold `n` > 0 elements and that buffer has room for them and
  // is no smaller than this one's; it then holds `n` elements and `other`
  // is empty. Returns whether it took it.
  bool TakeFrom(UninitializedArray& other, size_t n) {
    if (n == 0 || other.capacity_ < std::max(n, capacity_)) return false;
    *this = std::move(other);
    size_ = n;
    return true;
  }
  // Resize, then writes zeros into the whole capacity: the pages are in.
  void ResizeAndTouch(size_t n, size_t min_capacity = 0) {
    Resize(n, min_capacity);
    if (capacity_ > 0) std::memset(data_.get(), 0, capacity_ * sizeof(T));
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<T[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace cohort::train
