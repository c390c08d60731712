#include "mineru_health/resolver.h"

#include <ares.h>
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mineru_health {
namespace {

using Clock = std::chrono::steady_clock;

// ares_library_init is not thread-safe and must precede every channel.
void ensure_ares_library_init() {
  static std::once_flag once;
  static int code = ARES_SUCCESS;
  std::call_once(once, [] { code = ares_library_init(ARES_LIB_INIT_ALL); });
  if (code != ARES_SUCCESS) {
    throw std::runtime_error(std::string("c-ares could not start: ") +
                             ares_strerror(code));
  }
}

// What the lookup's callback leaves for resolve().
struct Lookup {
  bool done = false;
  int status = ARES_SUCCESS;
  std::vector<std::string> addresses;
};

std::string address_text(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = nullptr;
  if (address->sa_family == AF_INET) {
    raw = &reinterpret_cast<const sockaddr_in*>(address)->sin_addr;
  } else if (address->sa_family == AF_INET6) {
    raw = &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
  } else {
    return "";
  }
  if (inet_ntop(address->sa_family, raw, text, sizeof text) == nullptr)
    return "";
  return text;
}

void on_addrinfo(void* arg, int status, int /*timeouts*/,
                 ares_addrinfo* result) {
  auto* lookup = static_cast<Lookup*>(arg);
  lookup->done = true;
  lookup->status = status;
  if (result == nullptr) return;
  for (const ares_addrinfo_node* node = result->nodes; node != nullptr;
       node = node->ai_next) {
    if (node->ai_addr == nullptr) continue;
    std::string text = address_text(node->ai_addr);
    if (!text.empty()) lookup->addresses.push_back(std::move(text));
  }
  ares_freeaddrinfo(result);
}

}  // namespace

const char* to_string(ResolveOutcome outcome) {
  switch (outcome) {
    case ResolveOutcome::kAddresses:
      return "addresses";
    case ResolveOutcome::kEmpty:
      return "empty";
    case ResolveOutcome::kFailed:
      return "failed";
  }
  return "failed";
}

struct Resolver::Channel {
  ares_channel channel = nullptr;
  ~Channel() {
    if (channel != nullptr) ares_destroy(channel);
  }
};

Resolver::Resolver(const ResolverOptions& options)
    : options_(options), channel_(std::make_unique<Channel>()) {
  if (!(options.timeout_s > 0) || !std::isfinite(options.timeout_s)) {
    throw std::invalid_argument(
        "the DNS timeout must be a positive number of seconds");
  }
  if (options.max_addresses == 0) {
    throw std::invalid_argument("the DNS address bound must be at least 1");
  }
  ensure_ares_library_init();
  // Three tries within the whole bound; resolve() enforces the bound itself.
  const int total_ms =
      static_cast<int>(std::min(options.timeout_s, 86400.0) * 1000);
  ares_options ares{};
  ares.timeout = std::max(50, total_ms / 3);
  ares.tries = 3;
  const int code = ares_init_options(&channel_->channel, &ares,
                                     ARES_OPT_TIMEOUTMS | ARES_OPT_TRIES);
  if (code != ARES_SUCCESS) {
    channel_->channel = nullptr;
    throw std::runtime_error(std::string("c-ares could not make a channel: ") +
                             ares_strerror(code));
  }
  if (!options.servers.empty()) {
    const int set =
        ares_set_servers_ports_csv(channel_->channel, options.servers.c_str());
    if (set != ARES_SUCCESS) {
      throw std::invalid_argument("DNS servers \"" + options.servers +
                                  "\": " + ares_strerror(set) +
                                  " (expected host:port,host:port)");
    }
  }
}

Resolver::~Resolver() = default;

Resolution Resolver::resolve(const std::string& name) {
  Resolution answer;
  if (name.empty() || name.size() > 253) {
    answer.error = "not a DNS name: \"" + name.substr(0, 64) + "\"";
    return answer;
  }
  // An address is its own answer. c-ares 1.18 asks the servers first with
  // AF_UNSPEC and only then falls back to the literal: a lookup's whole time.
  in6_addr literal{};
  if (inet_pton(AF_INET, name.c_str(), &literal) == 1 ||
      inet_pton(AF_INET6, name.c_str(), &literal) == 1) {
    answer.outcome = ResolveOutcome::kAddresses;
    answer.addresses.push_back(name);
    return answer;
  }
  ares_channel channel = channel_->channel;
  Lookup lookup;
  ares_addrinfo_hints hints{};
  hints.ai_family = AF_UNSPEC;
  ares_getaddrinfo(channel, name.c_str(), nullptr, &hints, on_addrinfo,
                   &lookup);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(options_.timeout_s));
  bool timed_out = false;
  std::string poll_error;
  // Bounded: every pass either processes I/O or c-ares' own timers, and the
  // deadline cancels the lookup (its callback runs inside ares_cancel).
  while (!lookup.done) {
    const auto left = deadline - Clock::now();
    if (left <= Clock::duration::zero()) {
      timed_out = true;
      ares_cancel(channel);
      break;
    }
    ares_socket_t sockets[ARES_GETSOCK_MAXNUM];
    const int mask = ares_getsock(channel, sockets, ARES_GETSOCK_MAXNUM);
    pollfd fds[ARES_GETSOCK_MAXNUM];
    nfds_t count = 0;
    for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
      const bool readable = ARES_GETSOCK_READABLE(mask, i);
      const bool writable = ARES_GETSOCK_WRITABLE(mask, i);
      if (!readable && !writable) continue;
      fds[count].fd = sockets[i];
      fds[count].events = static_cast<short>((readable ? POLLIN : 0) |
                                             (writable ? POLLOUT : 0));
      fds[count].revents = 0;
      ++count;
    }
    const auto left_us =
        std::chrono::duration_cast<std::chrono::microseconds>(left).count();
    timeval most{static_cast<time_t>(left_us / 1000000),
                 static_cast<suseconds_t>(left_us % 1000000)};
    timeval wait{};
    const timeval* next = ares_timeout(channel, &most, &wait);
    const long long wait_ms =
        static_cast<long long>(next->tv_sec) * 1000 + next->tv_usec / 1000 + 1;
    const int ready =
        poll(fds, count, static_cast<int>(std::min(wait_ms, 1000LL)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      poll_error = std::string("poll failed: errno ") + std::to_string(errno);
      ares_cancel(channel);
      break;
    }
    if (ready == 0) {  // c-ares' own timers: retries, the next server
      ares_process_fd(channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
      continue;
    }
    for (nfds_t i = 0; i < count; ++i) {
      const bool in = (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) != 0;
      const bool out = (fds[i].revents & POLLOUT) != 0;
      if (!in && !out) continue;
      ares_process_fd(channel, in ? fds[i].fd : ARES_SOCKET_BAD,
                      out ? fds[i].fd : ARES_SOCKET_BAD);
    }
  }
  if (timed_out || !poll_error.empty()) {
    answer.error =
        timed_out ? fmt::format("no answer within {:g} s", options_.timeout_s)
                  : poll_error;
    return answer;
  }
  if (lookup.status == ARES_ENOTFOUND || lookup.status == ARES_ENODATA ||
      (lookup.status == ARES_SUCCESS && lookup.addresses.empty())) {
    answer.outcome = ResolveOutcome::kEmpty;
    answer.error = lookup.status == ARES_SUCCESS ? "no address in the answer"
                                                 : ares_strerror(lookup.status);
    return answer;
  }
  if (lookup.status != ARES_SUCCESS) {
    answer.error = ares_strerror(lookup.status);
    return answer;
  }
  std::sort(lookup.addresses.begin(), lookup.addresses.end());
  lookup.addresses.erase(
      std::unique(lookup.addresses.begin(), lookup.addresses.end()),
      lookup.addresses.end());
  if (lookup.addresses.size() > options_.max_addresses) {
    lookup.addresses.resize(options_.max_addresses);
    answer.truncated = true;
  }
  answer.outcome = ResolveOutcome::kAddresses;
  answer.addresses = std::move(lookup.addresses);
  return answer;
}

}  // namespace mineru_health
