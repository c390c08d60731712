// Classification of one complete /health answer. Every expected failure is a
// ProbeResult value; nothing here throws (JSON is parsed without exceptions
// and the whole body is guarded against allocation failure).
#include "mineru_health/probe.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace mineru_health {
namespace {

using nlohmann::json;

// Worker-provided text ends up in logs and audit lines: keep it bounded.
constexpr std::size_t kMaxDetailText = 200;

// Cuts `text` to at most kMaxDetailText bytes without splitting a UTF-8
// sequence, so the detail stays valid UTF-8 for Python and JSON writers.
std::string capped(std::string_view text) {
  if (text.size() <= kMaxDetailText) return std::string(text);
  std::size_t cut = kMaxDetailText;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80)
    --cut;
  return std::string(text.substr(0, cut)) + "...";
}

// The worker's own explanation, if its body is a JSON object with `error`.
std::string error_of(const json& doc) {
  if (!doc.is_object()) return "";
  auto it = doc.find("error");
  if (it == doc.end() || it->is_null()) return "";
  if (it->is_string()) return capped(it->get_ref<const std::string&>());
  return capped(it->dump(-1, ' ', false, json::error_handler_t::replace));
}

// /health bodies are flat; anything nested deeper is dropped while parsing.
// Dumping a value for a detail recurses once per level, so a body of a few
// hundred KB of '[' (MAX_BODY_BYTES allows 16 MiB) overflowed the poller
// thread's stack; dropped levels are also never allocated.
constexpr int kMaxJsonDepth = 32;

json parse_body(std::string_view body) {
  // allow_exceptions=false: a malformed body (including invalid UTF-8 inside
  // strings, which the lexer rejects) yields a `discarded` value.
  return json::parse(
      body.begin(), body.end(),
      [](int depth, json::parse_event_t /*event*/, json& /*parsed*/) {
        return depth <= kMaxJsonDepth;
      },
      /*allow_exceptions=*/false);
}

// A string field of the body, capped; "" when absent or not a string.
std::string text_of(const json& doc, const char* name) {
  auto it = doc.find(name);
  if (it == doc.end() || !it->is_string()) return "";
  return capped(it->get_ref<const std::string&>());
}

bool flag_of(const json& doc, const char* name) {
  auto it = doc.find(name);
  return it != doc.end() && it->is_boolean() && it->get<bool>();
}

// MinerU 4.0's own verdict on a dead engine: {"error": {"code":
// "engine_dead", ...}} (its JobStore.require_ready).
bool error_code_is(const json& doc, const char* code) {
  auto it = doc.find("error");
  if (it == doc.end() || !it->is_object()) return false;
  auto c = it->find("code");
  return c != it->end() && c->is_string() &&
         c->get_ref<const std::string&>() == code;
}

std::optional<double> seconds_of(const json& doc, const char* name) {
  auto it = doc.find(name);
  if (it == doc.end() || !it->is_number()) return std::nullopt;
  const double value = it->get<double>();
  if (!std::isfinite(value) || value < 0) return std::nullopt;
  return value;
}

std::optional<std::int64_t> count_of(const json& doc, const char* name) {
  auto it = doc.find(name);
  if (it == doc.end()) return std::nullopt;
  if (it->is_number_unsigned()) {
    const auto v = it->get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<std::int64_t>(v);
  }
  if (it->is_number_integer()) {
    const auto v = it->get<std::int64_t>();
    if (v < 0) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

// The advisory figures of a native endpoint's body, and the port a main
// port advertises. Read from unhealthy answers too: a hung loop's lag is
// worth showing.
void read_figures(const json& doc, ProbeResult& r) {
  if (!doc.is_object()) return;
  r.loop_lag_s = seconds_of(doc, "loop_lag_s");
  r.engine_calls_in_flight = count_of(doc, "engine_calls_in_flight");
  r.seconds_since_progress = seconds_of(doc, "seconds_since_progress");
  const std::optional<std::int64_t> port = count_of(doc, "native_health_port");
  if (port && *port >= 1 && *port <= 65535) {
    r.native_health_port = static_cast<int>(*port);
  }
  r.rule = text_of(doc, "rule");
  r.category = text_of(doc, "category");
}

ProbeResult fail(ProbeResult r, ProbeStatus status, std::string detail) {
  r.status = status;
  r.detail = std::move(detail);
  r.load = WorkerLoad{};
  return r;
}

struct LoadField {
  const char* name;
  std::int64_t WorkerLoad::*member;
};

constexpr std::array<LoadField, 6> kLoadFields = {{
    {"queued_tasks", &WorkerLoad::queued_tasks},
    {"processing_tasks", &WorkerLoad::processing_tasks},
    {"completed_tasks", &WorkerLoad::completed_tasks},
    {"failed_tasks", &WorkerLoad::failed_tasks},
    {"max_concurrent_requests", &WorkerLoad::max_concurrent_requests},
    {"processing_window_size", &WorkerLoad::processing_window_size},
}};

// Reads one integer field; false when present with the wrong type or out of
// int64 range.
bool read_int(const json& doc, const char* name, std::int64_t* out) {
  auto it = doc.find(name);
  if (it == doc.end()) return true;  // missing counts keep their default
  if (it->is_number_unsigned()) {
    auto v = it->get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(INT64_MAX)) return false;
    *out = static_cast<std::int64_t>(v);
    return true;
  }
  if (it->is_number_integer()) {
    *out = it->get<std::int64_t>();
    return true;
  }
  return false;
}

ProbeResult classify_impl(long http_status, std::string_view body,
                          bool truncated, const ProbeExpectations& expect) {
  ProbeResult r;
  r.http_status = http_status;

  if (http_status < 200 || http_status > 299) {
    // Only a complete body can prove the engine dead; a truncated one is
    // just another non-2xx answer.
    json doc = truncated ? json(json::value_t::discarded) : parse_body(body);
    read_figures(doc, r);
    if (http_status == 503 && doc.is_object()) {
      // Engine death first: when both hold, the engine is what a restart
      // must fix.
      if (flag_of(doc, "engine_dead") || error_code_is(doc, "engine_dead")) {
        std::string err = error_of(doc);
        return fail(std::move(r), ProbeStatus::kEngineDead,
                    err.empty()
                        ? std::string("HTTP 503: engine dead")
                        : fmt::format("HTTP 503: engine dead: {}", err));
      }
      if (flag_of(doc, "loop_hung")) {
        std::string err = error_of(doc);
        std::string lag =
            r.loop_lag_s ? fmt::format(" for {:.1f}s", *r.loop_lag_s) : "";
        return fail(
            std::move(r), ProbeStatus::kLoopHung,
            err.empty()
                ? fmt::format("HTTP 503: event loop hung{}", lag)
                : fmt::format("HTTP 503: event loop hung{}: {}", lag, err));
      }
    }
    std::string err = error_of(doc);
    return fail(std::move(r), ProbeStatus::kHttpStatus,
                err.empty() ? fmt::format("HTTP {}", http_status)
                            : fmt::format("HTTP {}: {}", http_status, err));
  }

  if (truncated) {
    return fail(
        std::move(r), ProbeStatus::kBodyTooLarge,
        fmt::format("body larger than {} bytes", expect.max_body_bytes));
  }

  json doc = parse_body(body);
  read_figures(doc, r);
  if (doc.is_discarded()) {
    return fail(std::move(r), ProbeStatus::kNotJsonObject,
                "body is not valid JSON (or not UTF-8)");
  }
  if (!doc.is_object()) {
    return fail(
        std::move(r), ProbeStatus::kNotJsonObject,
        fmt::format("body is a JSON {}, not an object", doc.type_name()));
  }

  auto status_it = doc.find("status");
  if (status_it == doc.end() || !status_it->is_string() ||
      status_it->get_ref<const std::string&>() != expect.expected_status) {
    std::string got =
        status_it == doc.end()
            ? std::string("missing")
            : capped(status_it->dump(-1, ' ', false,
                                     json::error_handler_t::replace));
    std::string err = error_of(doc);
    std::string detail =
        fmt::format("status {} (expected \"{}\")", got, expect.expected_status);
    if (!err.empty()) detail += fmt::format(": {}", err);
    return fail(std::move(r), ProbeStatus::kUnexpectedStatus,
                std::move(detail));
  }

  if (expect.protocol_version) {
    auto it = doc.find("protocol_version");
    std::int64_t version = 0;
    bool ok = it != doc.end() &&
              (it->is_number_integer() || it->is_number_unsigned()) &&
              read_int(doc, "protocol_version", &version) &&
              version == *expect.protocol_version;
    if (!ok) {
      std::string got = it == doc.end()
                            ? std::string("missing")
                            : capped(it->dump(-1, ' ', false,
                                              json::error_handler_t::replace));
      return fail(std::move(r), ProbeStatus::kBadProtocol,
                  fmt::format("protocol_version {} (expected {})", got,
                              *expect.protocol_version));
    }
  }

  WorkerLoad load;
  load.max_concurrent_requests = 0;
  for (const LoadField& field : kLoadFields) {
    std::int64_t value = load.*field.member;
    bool ok = read_int(doc, field.name, &value);
    if (!expect.require_load_fields) {
      // Engines with a plain {"status": "ok"} body: take what parses.
      if (ok) load.*field.member = value;
      continue;
    }
    if (!ok) {
      return fail(std::move(r), ProbeStatus::kBadFields,
                  fmt::format("{} is not an integer", field.name));
    }
    if (value < 0) {
      return fail(std::move(r), ProbeStatus::kBadFields,
                  fmt::format("{} is negative ({})", field.name, value));
    }
    load.*field.member = value;
  }
  if (expect.require_load_fields && load.max_concurrent_requests <= 0) {
    // The router divides by it when scoring workers.
    return fail(std::move(r), ProbeStatus::kBadFields,
                fmt::format("max_concurrent_requests must be positive (got {})",
                            load.max_concurrent_requests));
  }
  // MinerU's router treats a window below 1 as 1; do the same.
  if (load.processing_window_size < 1) load.processing_window_size = 1;

  r.status = ProbeStatus::kHealthy;
  r.load = load;
  return r;
}

}  // namespace

const char* to_string(ProbeStatus status) {
  switch (status) {
    case ProbeStatus::kHealthy:
      return "healthy";
    case ProbeStatus::kConnectError:
      return "connect_error";
    case ProbeStatus::kTimeout:
      return "timeout";
    case ProbeStatus::kHttpStatus:
      return "http_status";
    case ProbeStatus::kEngineDead:
      return "engine_dead";
    case ProbeStatus::kBodyTooLarge:
      return "body_too_large";
    case ProbeStatus::kNotJsonObject:
      return "not_json_object";
    case ProbeStatus::kUnexpectedStatus:
      return "unexpected_status";
    case ProbeStatus::kBadProtocol:
      return "bad_protocol";
    case ProbeStatus::kBadFields:
      return "bad_fields";
    case ProbeStatus::kTransportError:
      return "transport_error";
    case ProbeStatus::kLoopHung:
      return "loop_hung";
  }
  return "unknown";
}

const char* to_string(ProbeEndpoint endpoint) {
  switch (endpoint) {
    case ProbeEndpoint::kMain:
      return "main";
    case ProbeEndpoint::kNative:
      return "native";
  }
  return "unknown";
}

ProbeResult classify_health_response(long http_status, std::string_view body,
                                     bool truncated,
                                     const ProbeExpectations& expect) {
  try {
    return classify_impl(http_status, body, truncated, expect);
  } catch (const std::exception& e) {
    // Only allocation failure can get here; report it as a failed probe.
    ProbeResult r;
    r.http_status = http_status;
    r.status = ProbeStatus::kTransportError;
    r.detail = std::string("classification failed: ") + e.what();
    return r;
  } catch (...) {
    ProbeResult r;
    r.http_status = http_status;
    r.status = ProbeStatus::kTransportError;
    r.detail = "classification failed";
    return r;
  }
}

}  // namespace mineru_health
