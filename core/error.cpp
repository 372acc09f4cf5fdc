#include "core/error.h"

#include <cstdio>

namespace tandem {

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace tandem
