// `tandem profile`: per-layer forward and backward times of a model's two shards on their
// backends, at one micro-batch size, with the activation bytes crossing each node.
#pragma once

#include "cli/cli_args.h"

namespace tandem {

int profile_command(const CliArgs& args);

}  // namespace tandem
