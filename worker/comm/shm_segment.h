#pragma once
// ShmSegment: one POSIX shared-memory object (/dev/shm) mapped into this
// process, used by the same-host collectives (shm_collectives.h).
//
// Names carry the creating process's identity ("/cohort-<pid>-<start ticks>-
// <suffix>"), so a leftover of a process that died before unlinking its
// object can be recognised and removed (RemoveStaleSegments) by any later
// process on the host.
//
// Thread-compatible; the mapping itself may be shared by any threads and
// processes.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <sys/types.h>

#include "absl/status/statusor.h"
#include "worker/comm/local_peer.h"

namespace cohort::comm {

class ShmSegment {
 public:
  // The name a process with `owner` identity gives its segment `suffix`.
  static std::string Name(const ProcessIdentity& owner, const std::string& suffix);

  // Creates and maps `name`, `bytes` long and zero-filled; this process owns
  // it (the destructor unlinks it unless Unlink() already did). A leftover
  // object with the same name (a dead process whose pid was reused, or an
  // earlier context of this process) is replaced.
  // Errors: Internal (shm_open/ftruncate/mmap failed, with errno text).
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name, size_t bytes);
  // Maps an existing object of exactly `bytes`. NotFound while it does not
  // exist or is not yet sized (the creator may be between shm_open and
  // ftruncate): callers retry. Internal for other failures.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Open(const std::string& name, size_t bytes);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Removes the name (the mapping stays valid). Idempotent; only the owner
  // unlinks, and only while the name still refers to its own object: a
  // later Create of the same name (a newer communicator of this process)
  // replaced it, and that one's name must stay.
  void Unlink();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  ShmSegment(std::string name, uint8_t* data, size_t size, bool owner, ino_t inode)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner), inode_(inode) {}

  const std::string name_;
  uint8_t* const data_;
  const size_t size_;
  const bool owner_;
  const ino_t inode_;  // of the object this process created or opened
  bool linked_ = true;
};

// Unlinks every /dev/shm/cohort-* object whose creating process is gone.
// Returns how many were removed. Best effort: errors are ignored.
int RemoveStaleSegments();

}  // namespace cohort::comm
