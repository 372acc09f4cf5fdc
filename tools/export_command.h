// `tandem export`: the edge's and the cloud's checkpoints of one step merged into one
// safetensors file with PyTorch's names and layouts. `tandem evaluate`: a whole model's
// test-set accuracy (and predictions) from such a file, the way PyTorch would compute them.
#pragma once

#include "cli/command_line.h"

namespace tandem {

void declare_export(Command& export_);
void declare_evaluate(Command& evaluate);

}  // namespace tandem
