// `tandem stage --deployment FILE --party NAME`: one party's stage of a pipeline across
// parties, over mutual-TLS WebSockets to the parties before and after it
// (pipeline/stage_peer.h for the protocol, tools/deployment.h for the file).
#pragma once

#include "cli/command_line.h"

namespace tandem {

void declare_stage(Command& command);

}  // namespace tandem
