// `tandem text vocab|encode`: a SentencePiece vocabulary trained on a data set's training
// texts, and texts (JSON lines) encoded into a tensor data set an edge trains on (--data DIR).
#pragma once

#include "cli/command_line.h"

namespace tandem {

// `tandem text`: its commands vocab and encode.
void declare_text(Command& text);

}  // namespace tandem
