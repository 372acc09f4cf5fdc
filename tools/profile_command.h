// `tandem profile`: per-layer forward and backward times of a model's two shards on their
// backends, at one micro-batch size, with the activation bytes crossing each node.
#pragma once

#include "cli/command_line.h"

namespace tandem {

void declare_profile(Command& profile);

}  // namespace tandem
