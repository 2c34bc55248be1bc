#include "tests/testing/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/log.h"

namespace cohort::testing {
namespace {

// Closes the descriptor when it goes out of scope.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

int RemainingMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
}

// Waits until `fd` is ready for `events`; DeadlineExceeded past `deadline`.
absl::Status PollFd(int fd, short events, absl::Time deadline, const char* what) {
  while (true) {
    const int ms = RemainingMs(deadline);
    if (ms == 0) return absl::DeadlineExceededError(absl::StrCat("HttpGet: timed out ", what));
    struct pollfd pfd = {fd, events, 0};
    const int n = ::poll(&pfd, 1, ms);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
}

}  // namespace

int PickFreePort() {
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  CHECK(fd.get() >= 0) << "socket: " << std::strerror(errno);
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in addr {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  CHECK(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
      << "bind 127.0.0.1:0: " << std::strerror(errno);
  socklen_t len = sizeof(addr);
  CHECK(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      << "getsockname: " << std::strerror(errno);
  return ntohs(addr.sin_port);
}

absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path,
                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("HttpGet: want host:port, got ", host_port));
  }
  const std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);

  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* result = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &result);
  if (gai != 0 || result == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("HttpGet: cannot resolve ", host_port, ": ", ::gai_strerror(gai)));
  }
  ScopedFd fd(::socket(result->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) {
    ::freeaddrinfo(result);
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  const int rc = ::connect(fd.get(), result->ai_addr, result->ai_addrlen);
  const int connect_errno = errno;
  ::freeaddrinfo(result);
  if (rc != 0) {
    if (connect_errno != EINPROGRESS) {
      return absl::UnavailableError(
          absl::StrCat("HttpGet: connect ", host_port, ": ", std::strerror(connect_errno)));
    }
    if (absl::Status s = PollFd(fd.get(), POLLOUT, deadline, "connecting"); !s.ok()) return s;
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      return absl::UnavailableError(
          absl::StrCat("HttpGet: connect ", host_port, ": ", std::strerror(so_error)));
    }
  }

  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (absl::Status s = PollFd(fd.get(), POLLOUT, deadline, "sending"); !s.ok()) return s;
    } else {
      return absl::UnavailableError(absl::StrCat("HttpGet: send: ", std::strerror(errno)));
    }
  }

  // HTTP/1.0: the server closes the connection after the body.
  std::string response;
  char buf[16384];
  while (true) {
    const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n > 0) {
      response.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno == EAGAIN || errno == EINTR) {
      if (absl::Status s = PollFd(fd.get(), POLLIN, deadline, "reading"); !s.ok()) return s;
    } else {
      return absl::UnavailableError(absl::StrCat("HttpGet: recv: ", std::strerror(errno)));
    }
  }

  const size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::InternalError(
        absl::StrCat("HttpGet: no header end in response of ", response.size(), " bytes"));
  }
  const std::string status_line = response.substr(0, response.find("\r\n"));
  // "HTTP/1.1 200 OK"
  std::vector<absl::string_view> parts = absl::StrSplit(status_line, absl::MaxSplits(' ', 2));
  int code = 0;
  if (parts.size() < 2 || !absl::StartsWith(parts[0], "HTTP/") ||
      !absl::SimpleAtoi(parts[1], &code)) {
    return absl::InternalError(absl::StrCat("HttpGet: bad status line: ", status_line));
  }
  if (code != 200) {
    return absl::FailedPreconditionError(
        absl::StrCat("HttpGet ", host_port, path, ": ", status_line));
  }
  return response.substr(header_end + 4);
}

}  // namespace cohort::testing
