// Text into token ids with SentencePiece (Debian's libsentencepiece): the vocabulary trained on
// a data set's training texts, and the encoder an edge turns its texts into model inputs with.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tandem {

// The ids every tandem vocabulary reserves: padding, unknown pieces, the [CLS] token that opens
// every sequence (BERT pools it), and end of text.
inline constexpr int32_t kTextPadId = 0, kTextUnknownId = 1, kTextClsId = 2, kTextEndId = 3;

// Trains a unigram SentencePiece model of `vocab_size` pieces on `texts` (deterministic for
// the same texts) and writes it to `path`. Throws Error naming what SentencePiece refused.
void train_text_vocab(const std::vector<std::string>& texts, int vocab_size, const std::string& path);

class TextEncoder {
 public:
  explicit TextEncoder(const std::string& model_path);  // throws Error for a missing or bad model
  ~TextEncoder();
  int vocab_size() const;
  // Writes `tokens` ids and mask bytes: [CLS], the text's first tokens - 1 pieces, then
  // padding (id 0, mask 0). Returns how many pieces the whole text has (more than tokens - 1:
  // it was cut).
  int64_t encode(std::string_view text, int64_t tokens, int32_t* ids, uint8_t* mask) const;

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace tandem
