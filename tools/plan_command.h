// `tandem plan`: predicted split-training speed for every legal cut and micro-batch count on
// a given link, from measured (or given) compute speeds, with the edge's peak memory and the
// recommended cut and K.
#pragma once

#include "cli/command_line.h"

namespace tandem {

void declare_plan(Command& plan);

}  // namespace tandem
