// `tandem plan`: predicted split-training speed for every legal cut and micro-batch count on
// a given link, from measured (or given) compute speeds, with the edge's peak memory and the
// recommended cut and K.
#pragma once

#include "cli/cli_args.h"

namespace tandem {

int plan_command(const CliArgs& args);

}  // namespace tandem
