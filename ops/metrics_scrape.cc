#include "ops/metrics_scrape.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdlib>
#include <sstream>

namespace gridsync {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

Result<ScrapedMetrics> ScrapeMetrics(const std::string& address,
                                     std::chrono::milliseconds timeout) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) {
    return Status::InvalidArgument("metrics address '" + address + "'; allowed: host:port");
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
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
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);  // a hostile endpoint cannot exhaust us
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
          http::async_read(stream, buffer, parser, [&](beast::error_code ec4, size_t) {
            failed = ec4;
            done = !ec4;
          });
        });
      });
    });
    io.run_for(timeout);
    if (!done) {
      if (!failed || failed == beast::error::timeout) {
        return Status::Timeout("metrics at " + address + ": no reply within " +
                               std::to_string(timeout.count()) + " ms (" + stage + ")");
      }
      return Status::IOError("metrics at " + address + ": " + stage + ": " + failed.message());
    }
    beast::error_code ignored;
    stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    const auto& response = parser.get();
    if (response.result() != http::status::ok) {
      return Status::IOError("metrics at " + address + ": HTTP " +
                             std::to_string(response.result_int()));
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
  std::istringstream in(text);
  std::string line;
  size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    auto bad = [&](const char* why) {
      return Status::InvalidArgument("line " + std::to_string(number) + " ('" + line.substr(0, 80) +
                                     "'): " + why);
    };
    size_t i = line.find_first_of("{ ");
    if (i == std::string::npos || i == 0) return bad("no metric name");
    const std::string name = line.substr(0, i);
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
          if (line[j] == '\\' && j + 1 < line.size()) ++j;
          value += line[j];
        }
        if (j >= line.size()) return bad("an unterminated label value");
        sample.labels[key] = value;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) return bad("unterminated labels");
      ++i;  // '}'
    }
    const size_t start = line.find_first_not_of(' ', i);
    if (start == std::string::npos) return bad("no value");
    const std::string value = line.substr(start, line.find(' ', start) - start);
    char* end = nullptr;
    sample.value = std::strtod(value.c_str(), &end);
    if (end == value.c_str()) return bad("the value is not a number");
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
