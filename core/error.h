// Engine errors: every exception thrown inside tandem's engine is a tandem::Error whose
// message starts with "[where]" so a user can tell which part (and which node) refused.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tandem {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws Error("[where] what").
[[noreturn]] inline void fail(std::string_view where, std::string_view what) {
  std::string msg;
  msg.reserve(where.size() + what.size() + 3);
  msg.append("[").append(where).append("] ").append(what);
  throw Error(msg);
}

// Concatenates anything streamable into one string, for error messages.
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// `v` with `digits` digits after the point ("%.*f"), for logs and JSON lines.
std::string fixed(double v, int digits);

}  // namespace tandem
