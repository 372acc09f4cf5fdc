// Reads an ONNX file (a protobuf ModelProto, onnx/onnx.proto) into plain values
// (onnx_graph.h), decoding the protobuf wire format itself for the fields import reads.
// Why not Debian's libonnx/libprotobuf: Debian's libsentencepiece (tandem text) exports the
// 1,602 symbols of a protobuf-lite of its own, and a process that loads it beside
// libprotobuf.so.32 crashes in libprotobuf's static initialisers before main (measured:
// `tandem --help` segfaulted in ReflectionOps::FindInitializationErrors). The wire format is
// small and stable; every length and count is checked, so a malformed file is refused with
// an Error, never read out of bounds.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/interop/onnx_graph.h"

namespace tandem {

// `origin` names the file in errors ("[onnx] model.onnx: ...").
OnnxGraph parse_onnx(std::span<const uint8_t> bytes, const std::string& origin);

}  // namespace tandem
