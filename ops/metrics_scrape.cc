#include "ops/metrics_scrape.h"

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <utility>

namespace gridsync {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

// "host:port" (or "[v6]:port") apart, the port 1..65535 in decimal: a
// wider one wrapped and scraped another port than the one named.
Status SplitAddress(const std::string& address, std::string* host, std::string* port) {
  const auto colon = address.rfind(':');
  const auto bad = [&] {
    return Status::InvalidArgument("metrics address '" + address.substr(0, 80) +
                                   "'; allowed: host:port, the port 1..65535");
  };
  if (colon == std::string::npos) return bad();
  *host = address.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']')
    *host = host->substr(1, host->size() - 2);
  *port = address.substr(colon + 1);
  uint32_t number = 0;
  const auto [end, ec] = std::from_chars(port->data(), port->data() + port->size(), number);
  if (host->empty() || ec != std::errc() || end != port->data() + port->size() || number == 0 ||
      number > 65535 || *port != std::to_string(number)) {
    return bad();
  }
  return Status::OK();
}

// A sample value as the exposition format writes it: a decimal or
// exponent float, NaN, +Inf or -Inf. strtod alone took "0x10" as 16 and
// "1.5junk" as 1.5.
bool ParseValue(const std::string& text, double* value) {
  // Any case: prometheus-cpp writes "Nan" (the format's spelling is "NaN").
  std::string lower = text;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "nan") return *value = std::nan(""), true;
  if (lower == "+inf" || lower == "inf") return *value = HUGE_VAL, true;
  if (lower == "-inf") return *value = -HUGE_VAL, true;
  if (text.empty() || text.find_first_not_of("0123456789+-.eE") != std::string::npos) return false;
  char* end = nullptr;
  *value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

}  // namespace

Result<ScrapedMetrics> ScrapeMetrics(const std::string& address, std::chrono::milliseconds timeout,
                                     const std::function<bool()>& stopped) {
  std::string host, port;
  GRIDSYNC_RETURN_IF_ERROR(SplitAddress(address, &host, &port));
  try {
    // Asynchronous, under one deadline for the whole exchange: beast's
    // tcp_stream applies expires_after to asynchronous operations only, so
    // the blocking connect/write/read it replaced waited for as long as an
    // endpoint that accepts and never answers kept the connection open (a
    // hostile probe held `gridsync monitor --once` 40 s, past its SIGTERM).
    // run_for bounds the name lookup too.
    asio::io_context io;
    asio::ip::tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    http::request<http::empty_body> request(http::verb::get, "/metrics", 11);
    request.set(http::field::host, host);
    request.set(http::field::user_agent, "gridsync-monitor");
    beast::flat_buffer buffer(kMaxScrapedBufferBytes);
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxScrapedBodyBytes);
    beast::error_code failed;
    const char* stage = "resolving";
    bool done = false;
    resolver.async_resolve(host, port, [&](beast::error_code ec, auto results) {
      if (ec) return void(failed = ec);
      stage = "connecting";
      stream.expires_after(timeout);
      stream.async_connect(results, [&](beast::error_code ec2, const auto&) {
        if (ec2) return void(failed = ec2);
        stage = "sending the request";
        http::async_write(stream, request, [&](beast::error_code ec3, size_t) {
          if (ec3) return void(failed = ec3);
          stage = "reading the reply";
          // Its header first: Boost 1.74's async_read of a whole message
          // let a Content-Length past body_limit through (a 40 MB body was
          // read whole); the header's own read refuses it.
          http::async_read_header(stream, buffer, parser, [&](beast::error_code ec4, size_t) {
            if (ec4) return void(failed = ec4);
            http::async_read(stream, buffer, parser, [&](beast::error_code ec5, size_t) {
              failed = ec5;
              done = !ec5;
            });
          });
        });
      });
    });
    // In slices, so that a monitor told to stop does not wait out every
    // endpoint's timeout first.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (auto now = std::chrono::steady_clock::now(); !io.stopped() && now < deadline;
         now = std::chrono::steady_clock::now()) {
      if (stopped && stopped()) {
        return Status::Unavailable("metrics at " + address + ": stopped (" + stage + ")");
      }
      io.run_for(std::min<std::chrono::steady_clock::duration>(std::chrono::milliseconds(50),
                                                               deadline - now));
    }
    if (!done) {
      if (!failed || failed == beast::error::timeout) {
        return Status::Timeout("metrics at " + address + ": no reply within " +
                               std::to_string(timeout.count()) + " ms (" + stage + ")");
      }
      if (failed == http::error::body_limit || failed == http::error::buffer_overflow) {
        return Status::IOError("metrics at " + address + ": the reply is larger than " +
                               std::to_string(kMaxScrapedBodyBytes >> 20) +
                               " MiB (or a line of it than " +
                               std::to_string(kMaxScrapedBufferBytes >> 20) +
                               " MiB); allowed: a gridsync /metrics reply, a few KiB");
      }
      return Status::IOError("metrics at " + address + ": " + stage + ": " + failed.message());
    }
    beast::error_code ignored;
    stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    const auto& response = parser.get();
    if (response.result() != http::status::ok) {
      return Status::IOError("metrics at " + address + ": HTTP " +
                             std::to_string(response.result_int()) +
                             "; allowed: 200 OK to GET /metrics (redirects are not followed)");
    }
    auto parsed = ParseMetricsText(response.body());
    if (!parsed.ok()) return parsed.status().WithContext("metrics at " + address);
    return parsed;
  } catch (const std::exception& e) {
    return Status::IOError("metrics at " + address + ": " + e.what());
  }
}

Result<ScrapedMetrics> ParseMetricsText(const std::string& text) {
  ScrapedMetrics out;
  std::set<std::pair<std::string, std::map<std::string, std::string>>> seen;
  size_t samples = 0;
  std::istringstream in(text);
  std::string line;
  size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument("line " + std::to_string(number) + " ('" + line.substr(0, 80) +
                                     "'): " + why);
    };
    size_t i = line.find_first_of("{ \t", first);
    if (i == std::string::npos || i == first) return bad("no metric name and value");
    const std::string name = line.substr(first, i - first);
    ScrapedSample sample;
    if (line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find('=', i);
        if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"')
          return bad("a label without =\"value\"");
        const std::string key = line.substr(i, eq - i);
        std::string value;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) {
            ++j;
            value += line[j] == 'n' ? '\n' : line[j];  // \\ and \" are themselves
          } else {
            value += line[j];
          }
        }
        if (j >= line.size()) return bad("an unterminated label value");
        if (!sample.labels.emplace(key, std::move(value)).second)
          return bad("the label '" + key.substr(0, 40) + "' twice");
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) return bad("unterminated labels");
      ++i;  // '}'
    }
    const size_t start = line.find_first_not_of(" \t", i);
    if (start == std::string::npos || start == i) return bad("no value after the name and labels");
    const std::string value = line.substr(start, line.find_first_of(" \t", start) - start);
    if (!ParseValue(value, &sample.value)) {
      return bad("the value '" + value.substr(0, 40) +
                 "' is not a number; allowed: a decimal float, NaN, +Inf or -Inf");
    }
    if (++samples > kMaxScrapedSamples) {
      return bad("more than " + std::to_string(kMaxScrapedSamples) +
                 " samples; allowed: a gridsync /metrics reply, a few hundred");
    }
    if (!seen.emplace(name, sample.labels).second)
      return bad("a sample listed twice (the same name and labels)");
    out[name].push_back(std::move(sample));
  }
  return out;
}

double MetricValue(const ScrapedMetrics& metrics, const std::string& name,
                   const std::map<std::string, std::string>& match) {
  const auto it = metrics.find(name);
  if (it == metrics.end()) return 0;
  double sum = 0;
  for (const auto& s : it->second) {
    bool all = true;
    for (const auto& [k, v] : match) {
      const auto l = s.labels.find(k);
      all = all && l != s.labels.end() && l->second == v;
    }
    if (all) sum += s.value;
  }
  return sum;
}

}  // namespace gridsync
