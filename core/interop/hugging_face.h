// Hugging Face checkpoints as they come: older LayerNorm names (gamma, beta), half-precision
// weights (F16, BF16), BERT's longer position table and its token-type table (one segment).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/graph.h"
#include "core/interop/safetensors.h"

namespace tandem {

// The names a file may hold the tensors `names` under besides their own, for a reader that
// fetches only a shard's tensors: "X.LayerNorm.gamma" and ".beta" for a LayerNorm's weight and
// bias, and "X.token_type_embeddings.weight" beside a position table "X.position_embeddings".
std::vector<std::string> hugging_face_aliases(const Graph& whole, const std::vector<std::string>& names);

// The tensor the model calls `name`, from `tensors`, as F32 in the file's (torch's) layout:
//  - under its own name, or its LayerNorm alias;
//  - F16 and BF16 widened to F32;
//  - a position_embedding table with more rows than the model's positions (BERT's 512) cut
//    to its first rows;
//  - when the file has a token-type table "X.token_type_embeddings.weight" and the model no
//    such node, its row 0 (segment A: every token of a one-segment input) added to every row
//    of the position table "X.position_embeddings.weight", which is what BERT adds up.
// std::nullopt when the file has no such tensor. Throws Error for a dtype it cannot widen.
std::optional<SafeTensor> hugging_face_tensor(const Graph& whole, const std::vector<SafeTensor>& tensors,
                                              const std::string& name);

// What an exported file adds so Hugging Face's BERT loads it and computes what tandem does:
// for a BERT-style embedding block (nodes "X.word_embeddings" and "X.position_embeddings",
// no "X.token_type_embeddings") a zero token-type table "X.token_type_embeddings.weight"
// [2, features] (segment A's row was folded into the positions on import, if there was one).
std::vector<SafeTensor> hugging_face_export_extras(const Graph& whole);

}  // namespace tandem
