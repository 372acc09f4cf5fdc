// `tandem text vocab|encode`: a SentencePiece vocabulary trained on a data set's training
// texts, and texts (JSON lines) encoded into a tensor data set an edge trains on (--data DIR).
#pragma once

namespace tandem {

int text_command(int argc, char** argv);

}  // namespace tandem
