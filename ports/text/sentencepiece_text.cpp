// SentencePiece behind tandem's text encoder: training from memory through a SentenceIterator,
// the reserved ids fixed at training so every model agrees on padding and [CLS].
#include "ports/text/sentencepiece_text.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstdio>
#include <unordered_map>

#include "core/error.h"

namespace tandem {
namespace {

class Texts : public sentencepiece::SentenceIterator {
 public:
  explicit Texts(const std::vector<std::string>& texts) : texts_(texts) {}
  bool done() const override { return i_ >= texts_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return texts_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& texts_;
  std::size_t i_ = 0;
};

}  // namespace

void train_text_vocab(const std::vector<std::string>& texts, int vocab_size, const std::string& path) {
  if (texts.empty()) fail("text", "no texts to train a vocabulary on");
  if (vocab_size < 8) fail("text", cat("a vocabulary of ", vocab_size, " pieces is too small (at least 8)"));
  std::string prefix = path;
  if (prefix.size() > 6 && prefix.ends_with(".model")) prefix.resize(prefix.size() - 6);
  const std::unordered_map<std::string, std::string> options = {
      {"model_prefix", prefix},
      {"vocab_size", std::to_string(vocab_size)},
      {"model_type", "unigram"},
      {"pad_id", std::to_string(kTextPadId)},
      {"unk_id", std::to_string(kTextUnknownId)},
      {"bos_id", std::to_string(kTextClsId)},
      {"eos_id", std::to_string(kTextEndId)},
      {"character_coverage", "0.9995"},
      {"max_sentence_length", "65536"},  // a mail is one "sentence"; the default 4192 bytes drops long ones
      {"num_threads", "2"},
      {"minloglevel", "2"},
  };
  Texts iterator(texts);
  const auto status = sentencepiece::SentencePieceTrainer::Train(options, &iterator);
  if (!status.ok()) fail("text", cat("SentencePiece could not train a vocabulary of ", vocab_size, " pieces: ", status.ToString()));
  // SentencePiece writes PREFIX.model and PREFIX.vocab; a path without ".model" gets it renamed.
  if (prefix == path && std::rename((prefix + ".model").c_str(), path.c_str()) != 0)
    fail("text", cat("cannot rename ", prefix, ".model to ", path));
}

TextEncoder::TextEncoder(const std::string& model_path) : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto status = sp_->Load(model_path);
  if (!status.ok()) fail("text", cat("cannot load the SentencePiece model ", model_path, ": ", status.ToString()));
  if (sp_->pad_id() != kTextPadId || sp_->bos_id() != kTextClsId)
    fail("text", cat(model_path, " reserves pad id ", sp_->pad_id(), " and bos id ", sp_->bos_id(), ", not ", kTextPadId,
                     " and ", kTextClsId, ": train it with `tandem text vocab`"));
}

TextEncoder::~TextEncoder() = default;

int TextEncoder::vocab_size() const { return sp_->GetPieceSize(); }

int64_t TextEncoder::encode(std::string_view text, int64_t tokens, int32_t* ids, uint8_t* mask) const {
  if (tokens < 1) fail("text", "a sequence needs at least one token (its [CLS])");
  std::vector<int> pieces;
  const auto status = sp_->Encode(text, &pieces);
  if (!status.ok()) fail("text", cat("SentencePiece could not encode a text: ", status.ToString()));
  const int64_t kept = std::min<int64_t>(static_cast<int64_t>(pieces.size()), tokens - 1);
  ids[0] = kTextClsId;
  mask[0] = 1;
  for (int64_t i = 0; i < tokens - 1; ++i) {
    ids[i + 1] = i < kept ? pieces[static_cast<std::size_t>(i)] : kTextPadId;
    mask[i + 1] = i < kept ? 1 : 0;
  }
  return static_cast<int64_t>(pieces.size());
}

}  // namespace tandem
