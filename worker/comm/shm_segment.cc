#include "worker/comm/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace cohort::comm {
namespace {

constexpr char kPrefix[] = "cohort-";

absl::Status ErrnoError(const std::string& what, const std::string& name) {
  return absl::InternalError(absl::StrCat(what, " ", name, ": ", std::strerror(errno)));
}

absl::StatusOr<uint8_t*> Map(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoError("mmap", name);
  return static_cast<uint8_t*>(p);
}

}  // namespace

std::string ShmSegment::Name(const ProcessIdentity& owner, const std::string& suffix) {
  return absl::StrCat("/", kPrefix, owner.pid, "-", owner.start_ticks, "-", suffix);
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(const std::string& name,
                                                               size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0 && errno == EEXIST) {
    // Our identity is in the name, so the holder is gone or is an earlier
    // object of this very process that was not cleaned up: replace it.
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  }
  if (fd < 0) return ErrnoError("shm_open", name);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    absl::Status status = ErrnoError("ftruncate", name);
    close(fd);
    shm_unlink(name.c_str());
    return status;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    absl::Status status = ErrnoError("fstat", name);
    close(fd);
    shm_unlink(name.c_str());
    return status;
  }
  absl::StatusOr<uint8_t*> data = Map(fd, bytes, name);
  close(fd);
  if (!data.ok()) {
    shm_unlink(name.c_str());
    return data.status();
  }
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(name, *data, bytes, /*owner=*/true, st.st_ino));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Open(const std::string& name,
                                                             size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("shm ", name, " not created yet"));
    return ErrnoError("shm_open", name);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    absl::Status status = ErrnoError("fstat", name);
    close(fd);
    return status;
  }
  if (static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    return absl::NotFoundError(
        absl::StrCat("shm ", name, " is ", st.st_size, " bytes, expected ", bytes));
  }
  absl::StatusOr<uint8_t*> data = Map(fd, bytes, name);
  close(fd);
  if (!data.ok()) return data.status();
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(name, *data, bytes, /*owner=*/false, st.st_ino));
}

ShmSegment::~ShmSegment() {
  Unlink();
  munmap(data_, size_);
}

void ShmSegment::Unlink() {
  if (!owner_ || !linked_) return;
  linked_ = false;
  // POSIX shared memory objects live in /dev/shm on Linux.
  struct stat st {};
  if (stat(absl::StrCat("/dev/shm", name_).c_str(), &st) != 0 || st.st_ino != inode_) return;
  shm_unlink(name_.c_str());
}

int RemoveStaleSegments() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  std::vector<std::string> stale;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(kPrefix, 0) != 0) continue;
    // cohort-<pid>-<start ticks>-<suffix>
    std::vector<std::string> parts = absl::StrSplit(name.substr(sizeof(kPrefix) - 1), '-');
    ProcessIdentity owner;
    if (parts.size() < 3 || !absl::SimpleAtoi(parts[0], &owner.pid) ||
        !absl::SimpleAtoi(parts[1], &owner.start_ticks)) {
      continue;
    }
    if (ProcessGone(owner)) stale.push_back("/" + name);
  }
  closedir(dir);
  for (const std::string& name : stale) shm_unlink(name.c_str());
  return static_cast<int>(stale.size());
}

}  // namespace cohort::comm
