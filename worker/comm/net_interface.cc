#include "worker/comm/net_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"

namespace cohort::comm {

absl::StatusOr<NetInterface> InterfaceOf(const std::string& ip) {
  in_addr v4{};
  in6_addr v6{};
  const bool is_v4 = inet_pton(AF_INET, ip.c_str(), &v4) == 1;
  const bool is_v6 = !is_v4 && inet_pton(AF_INET6, ip.c_str(), &v6) == 1;
  if (!is_v4 && !is_v6) {
    return absl::InvalidArgumentError(absl::StrCat("'", ip, "' is not a numeric IP address"));
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::InternalError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  std::optional<NetInterface> found;
  for (const ifaddrs* a = list; a != nullptr && !found.has_value(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    bool match = false;
    if (is_v4 && a->ifa_addr->sa_family == AF_INET) {
      match = reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == v4.s_addr;
    } else if (is_v6 && a->ifa_addr->sa_family == AF_INET6) {
      match = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr, &v6,
                          sizeof(v6)) == 0;
    }
    if (match) found = NetInterface{a->ifa_name, (a->ifa_flags & IFF_LOOPBACK) != 0};
  }
  freeifaddrs(list);
  if (!found.has_value()) {
    return absl::NotFoundError(absl::StrCat("no network interface here has address ", ip));
  }
  return *found;
}

std::string ResolveNetDevices(const std::string& setting, const std::string& announced_host) {
  if (setting == "all") return "";
  if (setting != "auto") return setting;
  absl::StatusOr<NetInterface> interface = InterfaceOf(announced_host);
  if (!interface.ok() || interface->loopback) return "";
  return interface->name;
}

}  // namespace cohort::comm
