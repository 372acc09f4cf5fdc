#include "cli/command_line.h"
#include "core/error.h"
#include "tandem_commit.h"

namespace tandem {

std::string tandem_version() {
  const std::string date = TANDEM_COMMIT_DATE;
  return cat(TANDEM_VERSION, " (commit ", TANDEM_COMMIT, date.empty() ? "" : ", ", date, ")");
}

}  // namespace tandem
